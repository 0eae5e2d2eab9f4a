"""The composition root: the `opd` command line, the `serve` supervisor and the Python SDK
(`from opd import Client, AsyncClient`), with `load_spec` to read a spec file.

The only package that may import both the service (`app`) and the worker; the SDK imports
neither the worker nor torch.
"""

from kernel.spec import load_spec
from opd.sdk import (
    APIConnectionError,
    AsyncClient,
    AuthenticationError,
    Client,
    Conflict,
    NotFound,
    OPDAPIError,
    PermissionDenied,
    RateLimited,
    ValidationError,
)

__all__ = [
    "APIConnectionError",
    "AsyncClient",
    "AuthenticationError",
    "Client",
    "Conflict",
    "NotFound",
    "OPDAPIError",
    "PermissionDenied",
    "RateLimited",
    "ValidationError",
    "load_spec",
]
