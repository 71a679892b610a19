"""What to predict and its data: the catalogue, task kinds, task data, splits, metrics, thresholds."""
