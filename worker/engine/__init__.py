"""The OPD engine: one loop, usable from `opd run` and from the service's worker."""
