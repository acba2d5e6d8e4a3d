"""Layer 7, runs and what they report: a run end to end (`execute`: where it trains, what is
measured after, its outputs), the speedup summary, the forecast beyond this machine and its
report, and the scaling grid of a sweep (`scaling_grid`) with its table and charts."""
