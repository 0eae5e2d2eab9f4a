"""Where a run's metrics, events and checkpoints go: sinks (console, JSON lines, SwanLab,
the service's database through the worker) and trackers (MLflow)."""
