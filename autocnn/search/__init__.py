"""The tuning machinery: search, measurement workers, measurement sources, baselines."""
