"""The worker side: the OPD engine, its backends, datasets, metric sinks and the arq worker."""
