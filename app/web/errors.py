"""Errors on dashboard pages are pages too: a person sees a message, not JSON.

The API's handlers stay in charge of everything outside /ui; for dashboard paths the same
exceptions render the error page with the same status (404 for another team's job).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import quote

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.idempotency import IdempotencyMismatch
from app.files.errors import FileInUse, FileNotFound
from app.jobs.errors import IllegalTransition, JobNotFound
from app.sweeps.errors import SweepNotFound
from app.web.templating import render
from kernel.wording import one_line, problems

log = logging.getLogger(__name__)

Handler = Callable[[Request, Exception], Awaitable[Response]]


class WebError(Exception):
    """Answer a dashboard request with this status and message on the error page."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


class SignInRequired(Exception):
    """The page needs a signed-in browser; it is sent to the sign-in page and back."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def sign_in_url(next_path: str) -> str:
    return f"/ui/sign-in?next={quote(next_path, safe='/')}"


def describe(exc: Exception) -> tuple[int, str]:
    """The status and the message a person sees for an exception on a dashboard page."""
    if isinstance(exc, WebError):
        return exc.status_code, exc.message
    if isinstance(exc, JobNotFound):
        return 404, "No such job (or it belongs to another team)."
    if isinstance(exc, SweepNotFound):
        return 404, "No such sweep (or it belongs to another team)."
    if isinstance(exc, FileNotFound):
        return 404, "No such file (or it belongs to another team)."
    if isinstance(exc, FileInUse):
        return 409, str(exc)
    if isinstance(exc, IllegalTransition):
        return 409, str(exc)
    if isinstance(exc, IdempotencyMismatch):
        return 409, str(exc)
    if isinstance(exc, RequestValidationError):
        found = problems(error | {"loc": tuple(error["loc"][1:])} for error in exc.errors())
        return 400, f"Bad address: {one_line(found)}"
    if isinstance(exc, StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return exc.status_code, "No such page." if exc.status_code == 404 else detail
    if isinstance(exc, (OperationalError, InterfaceError)):
        return 503, "The database is unavailable; retry shortly."
    log.error("unhandled error on a dashboard page", exc_info=exc)
    return 500, "Internal error; the server log has the details."


async def error_page(request: Request, exc: Exception) -> Response:
    status_code, message = describe(exc)
    context = {"status_code": status_code, "message": message}
    return render(request, "error.html", context, status_code)


async def to_sign_in(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SignInRequired)
    return RedirectResponse(sign_in_url(exc.next_path), status_code=303)


def install_error_pages(app: FastAPI, is_dashboard: Callable[[str], bool]) -> None:
    """Route dashboard requests' errors to the error page; others to the API's handlers."""
    for exc_class in (
        RequestValidationError,
        StarletteHTTPException,
        JobNotFound,
        SweepNotFound,
        FileNotFound,
        FileInUse,
        IllegalTransition,
        IdempotencyMismatch,
        OperationalError,
        InterfaceError,
        Exception,
    ):
        app.add_exception_handler(
            exc_class, dispatch(app.exception_handlers.get(exc_class), is_dashboard)
        )
    app.add_exception_handler(WebError, error_page)
    app.add_exception_handler(SignInRequired, to_sign_in)


def dispatch(api_handler: Handler | None, is_dashboard: Callable[[str], bool]) -> Handler:
    async def handle(request: Request, exc: Exception) -> Response:
        if api_handler is None or is_dashboard(request.url.path):
            return await error_page(request, exc)
        return await api_handler(request, exc)

    return handle
