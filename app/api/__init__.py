"""The HTTP API (FastAPI): routes per resource, typed dependencies, one error format."""
