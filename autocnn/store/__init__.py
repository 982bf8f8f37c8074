"""The tuning database: records, files, lookup."""
