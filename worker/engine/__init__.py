"""The OPD engine: the loop, datums, sinks, backends and datasets.

It knows no queue, database or HTTP server: `opd run` uses it alone, like the reference
scripts, and the worker's service glue drives it for the service.
"""
