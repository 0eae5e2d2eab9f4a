"""The composition root: the `opd` command line, the `serve` supervisor and the HTTP client.

The only package that may import both the service (`app`) and the worker.
"""
