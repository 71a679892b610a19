"""What the DAG files wire: their callables, the params they read, and the work root that confines paths."""
