"""The Python SDK of the OPD API: `Client`, `AsyncClient`, their results and errors."""

from opd.sdk.client import AsyncClient, AsyncJob, Client, Job
from opd.sdk.errors import (
    APIConnectionError,
    AuthenticationError,
    BadRequest,
    Conflict,
    NotFound,
    OPDAPIError,
    OPDError,
    PermissionDenied,
    RateLimited,
    ServerError,
    ValidationError,
    WaitTimeout,
)
from opd.sdk.results import Curves, Download
from opd.sdk.transport import Retries

__all__ = [
    "APIConnectionError",
    "AsyncClient",
    "AsyncJob",
    "AuthenticationError",
    "BadRequest",
    "Client",
    "Conflict",
    "Curves",
    "Download",
    "Job",
    "NotFound",
    "OPDAPIError",
    "OPDError",
    "PermissionDenied",
    "RateLimited",
    "Retries",
    "ServerError",
    "ValidationError",
    "WaitTimeout",
]
