"""Tuning reports: reading storages and benchmark files, figures, HTML."""
