"""The `trio` backend: PyTRIO's own ServiceClient, configured from the job spec.

PyTRIO reads its timeouts when a ServiceClient is made, so they are set first, with
`pytrio.configure`'s real option names (the reference's `configure(timeout=...)` is an
unknown option that PyTRIO ignores with a warning). `ERRORS` says which PyTRIO errors are
worth another try and which are about credentials; the local backend raises PyTRIO's
error types too, so it reads its errors the same way.
"""

from __future__ import annotations

import pytrio
from pytrio.auth.flow import is_relogin_auth_error
from pytrio.config.config import auth_state
from pytrio.errors.auth import AuthError
from pytrio.errors.base import PyTrioError

from kernel.errors import BackendFailure, OPDError
from kernel.spec import TrioBackendSpec
from worker.engine.backends.contract import ServiceClient
from worker.engine.backends.resilient import (
    AUTH_STATUS_CODES,
    Errors,
    Failure,
    Kind,
    network_failure,
)

LOGIN_HINT = "set PYTRIO_API_KEY in the worker's environment or run `trio login` on its machine"


def classify(error: BaseException) -> Failure | None:
    """PyTRIO says whether its error is retryable; network errors beneath it are."""
    if isinstance(error, PyTrioError):
        status = f", HTTP {error.status_code}" if error.status_code else ""
        description = f"{error.message} ({error.code}{status})"
        if error.retryable:
            return Failure(Kind.transient, description)
        auth = (
            isinstance(error, AuthError)
            or is_relogin_auth_error(error)
            or error.status_code in AUTH_STATUS_CODES
        )
        return Failure(Kind.auth if auth else Kind.rejected, description, error.hint or "")
    return network_failure(error)


ERRORS = Errors(classify=classify, login_hint=LOGIN_HINT, retry_option="trio.call_attempts")


def connect_trio(options: TrioBackendSpec) -> ServiceClient:
    """Configure PyTRIO and open a ServiceClient (looked up now, so tests can swap it)."""
    pytrio.configure(
        request_timeout_seconds=options.request_timeout_seconds,
        sampling_timeout_seconds=options.sampling_timeout_seconds,
        retry_max_attempts=options.retry_max_attempts,
    )
    check_credentials()
    try:
        return pytrio.ServiceClient()
    except pytrio.PyTrioError as error:
        if isinstance(error, AuthError) or is_relogin_auth_error(error):
            raise OPDError(
                f"PyTRIO rejected the login: {error}; {LOGIN_HINT}", code="backend_auth"
            ) from error
        raise BackendFailure(f"cannot start a PyTRIO session: {error}") from error


def check_credentials() -> None:
    """Fail before any network call when PyTRIO has no API key to send.

    PyTRIO takes the key from PYTRIO_API_KEY (read when it is imported) or from the
    profile `trio login` saved under ~/.pytrio; both end up in its `auth_state`.
    """
    if auth_state.config_error is not None:
        raise OPDError(
            f"PyTRIO cannot read its login profile: {auth_state.config_error}; {LOGIN_HINT}",
            code="backend_auth",
        )
    if not auth_state.api_key.strip():
        raise OPDError(f"no PyTRIO credentials: {LOGIN_HINT}", code="backend_auth")
