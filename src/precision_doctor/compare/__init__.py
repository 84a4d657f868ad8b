"""Output comparison: error metrics, tolerances, task metrics."""
