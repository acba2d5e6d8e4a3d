"""Layer 8, what runs report: the speedup summary and the time to target compared
(`summary`, `target_comparison`), the forecast beyond this machine and its report, the
plan to a target (`plan`), and the scaling grid of a sweep (`scaling_grid`) with its table
and charts."""
