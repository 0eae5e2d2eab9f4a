"""The API's error envelope (`{"error": {"code", "message", "param"}}`) as exceptions, one
class per family, so that callers catch what they can act on."""

from __future__ import annotations

import json


class OPDError(Exception):
    """Anything the SDK raises."""


class APIConnectionError(OPDError):
    """No answer came from the API (it is down, unreachable, or the answer was cut off),
    after the retries a request was allowed."""


class WaitTimeout(OPDError):
    """`wait` gave up before the job reached a final status."""


class OPDAPIError(OPDError):
    """The API answered with an error: its HTTP status and the envelope's fields."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after


class BadRequest(OPDAPIError):
    """400, 413, 415: the body could not be read (not JSON, too large)."""


class AuthenticationError(OPDAPIError):
    """401: a missing, unknown, revoked or expired key."""


class PermissionDenied(OPDAPIError):
    """403: the key's scope does not allow this; the message names the scope needed."""


class NotFound(OPDAPIError):
    """404: no such thing, or it belongs to another team."""


class Conflict(OPDAPIError):
    """409: the job's status (or the checkpoint's kind) does not allow this."""


class ValidationError(OPDAPIError):
    """422: invalid input; `param` names the field (e.g. `loop.steps`)."""


class RateLimited(OPDAPIError):
    """429: the team has as many queued jobs as it may; `retry_after` says when to retry."""


class ServerError(OPDAPIError):
    """5xx: the API or a dependency of it (database, Redis, a worker) failed."""


FAMILIES: dict[int, type[OPDAPIError]] = {
    400: BadRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: BadRequest,
    415: BadRequest,
    422: ValidationError,
    429: RateLimited,
}


def seconds(header: str | None) -> float | None:
    """A `Retry-After` given in seconds (the API never sends an HTTP date)."""
    try:
        return max(0.0, float(header)) if header is not None else None
    except ValueError:
        return None


def api_error(status: int, body: bytes, retry_after: str | None = None) -> OPDAPIError:
    """The exception for an error answer; a body that is no envelope keeps its first bytes."""
    try:
        detail = json.loads(body)["error"]
        code, message, param = detail["code"], detail["message"], detail.get("param")
    except (ValueError, KeyError, TypeError):
        code, message, param = "error", body[:200].decode(errors="replace"), None
    family = FAMILIES.get(status, ServerError if status >= 500 else OPDAPIError)
    return family(status, code, message, param, seconds(retry_after))
