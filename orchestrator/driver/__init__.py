"""Driver-side parts that guard the run directory (one driver per run dir)."""
