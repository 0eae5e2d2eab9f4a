"""The `trio` backend: PyTRIO's own ServiceClient, configured from the job spec.

PyTRIO reads its timeouts when a ServiceClient is made, so they are set first, with
`pytrio.configure`'s real option names (the reference's `configure(timeout=...)` is an
unknown option that PyTRIO ignores with a warning). `ERRORS` says which PyTRIO errors are
worth another try and which are about credentials; the local backend raises PyTRIO's
error types too, so it reads its errors the same way. Checkpoint archives come down
through PyTRIO's own REST client (`download_archive`).
"""

from __future__ import annotations

from pathlib import Path

import pytrio
from pytrio.auth.flow import is_relogin_auth_error
from pytrio.client.rest import RestClient
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
    backend_failure,
    explain,
    network_failure,
)

LISTING_PAGE = 100
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
    return open_trio(options)


def open_trio(options: TrioBackendSpec) -> pytrio.ServiceClient:
    """PyTRIO's own ServiceClient, configured, once the credentials are there."""
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


async def download_archive(options: TrioBackendSpec, path: str, destination: Path) -> None:
    """PyTRIO's archive of the checkpoint saved at `path`, written to `destination` by its
    REST client (which resumes a partial file and renews an expiring download URL)."""
    rest = open_trio(options).create_rest_client()
    try:
        checkpoint_id = await find_checkpoint(rest, path)
        await rest.download_checkpoint_async(checkpoint_id, destination, resume=True)
    except Exception as error:
        explain(error, backend_failure(error, "download_checkpoint", ERRORS))


async def find_checkpoint(rest: RestClient, path: str) -> str:
    """The id PyTRIO's REST API knows the checkpoint at `path` by (its pages of the
    workspace's checkpoints are searched in order)."""
    offset = 0
    while True:
        page = await rest.list_user_checkpoints_async(limit=LISTING_PAGE, offset=offset)
        for checkpoint in page.checkpoints:
            if checkpoint.path == path:
                return checkpoint.checkpoint_id
        offset += len(page.checkpoints)
        if not page.checkpoints or page.cursor is None or offset >= page.cursor.total_count:
            raise OPDError(
                f"PyTRIO lists no checkpoint at {path} (it may have expired or been deleted)",
                code="checkpoint_not_found",
            )
