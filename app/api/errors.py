"""One error format for every failure: `{"error": {"code", "message", "param"}}`.

Bad input is a 4xx that names the field; nothing a client sends produces a traceback.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.budgets.errors import BudgetExceeded, BudgetRefused
from app.core.documents import TooLargeToStore
from app.core.idempotency import IdempotencyMismatch
from app.core.tables import utcnow
from app.core.waits import RETRY_AFTER_SECONDS, TooManyWaiting
from app.files.errors import FileInUse, FileNotFound, FileRefused
from app.jobs.errors import (
    IllegalTransition,
    JobNotFound,
    SpecNotFound,
    SpecRefused,
)
from app.stored_completions.errors import StoredQuotaExceeded
from app.sweeps.errors import SweepNotFound
from app.teams.store import TeamNotFound
from app.webhooks.store import WebhookNotFound
from kernel.storage.blobs import StorageUnavailable
from kernel.wording import Problem, one_line, problems

log = logging.getLogger(__name__)

LOCATIONS = {"body", "query", "path", "header", "cookie"}
STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "unavailable",
}
DESCRIPTIONS = {
    400: "The request body could not be parsed (it must be UTF-8 JSON).",
    401: "Missing, unknown, revoked or expired API key.",
    403: "The key's scope does not allow this; the message names the scope needed.",
    404: "No such job (or it belongs to another team).",
    409: "The job's status does not allow this action; the message says why.",
    413: "The request body is larger than OPD_MAX_BODY_BYTES, or the spec or sweep it makes "
    "larger than OPD_MAX_SPEC_BYTES.",
    415: "The body is not JSON: send `Content-Type: application/json` (the CLI and the SDK "
    "send a YAML spec or sweep file as JSON).",
    429: "The team has as many queued jobs as it may (`too_many_requests`), or spent its "
    "budget this period (`budget_exceeded`: the body's `budget` says what was spent, the "
    "budget and when the period ends); retry after `Retry-After` seconds.",
    422: "Invalid request; `param` names the offending field (e.g. `loop.steps`).",
    503: "A dependency (database or Redis) is unavailable.",
}


class ErrorDetail(BaseModel):
    code: str
    message: str
    param: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """Raise from a route to answer with this status and error body."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = ErrorDetail(code=code, message=message, param=param)
        self.headers = headers


def error_response(
    status_code: int,
    code: str,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(code=code, message=message, param=param))
    return JSONResponse(body.model_dump(), status_code=status_code, headers=headers)


def describe_status(code: int) -> str:
    return DESCRIPTIONS.get(code, HTTPStatus(code).phrase)


def error_responses(*status_codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries documenting the error body for these statuses."""
    return {
        code: {"model": ErrorResponse, "description": describe_status(code)}
        for code in status_codes
    }


def body_type(request: Request) -> Any:
    """The type the request's route reads its body as (None: no body), against which a
    refused body's fields are named and unknown keys matched to the fields meant."""
    field = getattr(request.scope.get("route"), "body_field", None)
    return None if field is None else field.field_info.annotation


def explain(exc: RequestValidationError, body: Any = None) -> tuple[str, str]:
    """What is wrong with a request, in the user's words (kernel/wording.py), and the field
    to blame first (`body` for the body as a whole)."""
    found: list[Problem] = []
    by_location: dict[str, list[dict[str, Any]]] = {}
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            reason = error.get("ctx", {}).get("error", "")
            found.append(("", f"the request body is not valid JSON: {reason}".rstrip(": ")))
            continue
        loc = list(error.get("loc", ()))
        where = str(loc.pop(0)) if loc and loc[0] in LOCATIONS else "body"
        by_location.setdefault(where, []).append(error | {"loc": tuple(loc)})
    for where, errors in by_location.items():
        found.extend(problems(errors, body if where == "body" else None))
    return one_line(found) or "invalid request", (found[0][0] if found else "") or "body"


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = explain(exc, body_type(request))
    return error_response(422, "invalid_request", message, param)


async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(
        ErrorResponse(error=exc.detail).model_dump(), exc.status_code, headers=exc.headers
    )


async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = STATUS_CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    return error_response(exc.status_code, code, message, headers=exc.headers)


async def on_not_found(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(404, "not_found", str(exc))


async def on_conflict(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(409, "conflict", str(exc))


async def on_spec_refused(_request: Request, exc: Exception) -> JSONResponse:
    """What admission (app/jobs/admission.py) refuses: a 422 naming the field."""
    assert isinstance(exc, SpecRefused)
    return error_response(422, "invalid_request", str(exc), exc.param)


async def on_spec_not_found(_request: Request, exc: Exception) -> JSONResponse:
    """A spec naming what is not the caller's team's (an uploaded file): a 404 naming it."""
    assert isinstance(exc, SpecNotFound)
    return error_response(404, "not_found", str(exc), exc.param)


async def on_file_refused(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FileRefused)
    headers = None if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
    return error_response(exc.status, exc.code, exc.message, exc.param, headers)


async def on_storage_down(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("object store unavailable: %s", exc)
    return error_response(
        503, "storage_unavailable", "the object store is unavailable; retry shortly"
    )


async def on_too_large_to_store(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(413, "too_large_to_store", str(exc))


async def on_idempotency_mismatch(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(422, "idempotency_key_reused", str(exc), "Idempotency-Key")


async def on_too_many_waiting(_request: Request, exc: Exception) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return error_response(429, "too_many_requests", str(exc), headers=headers)


async def on_stored_quota(_request: Request, exc: Exception) -> JSONResponse:
    """A request with `store` when the team keeps as many stored completions as it may:
    refused before anything is sampled."""
    return error_response(429, "stored_completions_quota", str(exc), "store")


async def on_budget_exceeded(_request: Request, exc: Exception) -> JSONResponse:
    """The team's budget is spent: a 429 that says what was spent, the budget and when
    the period ends (in words, and as figures beside the error)."""
    assert isinstance(exc, BudgetExceeded)
    wait = exc.retry_after(utcnow())
    body = ErrorResponse(error=ErrorDetail(code="budget_exceeded", message=str(exc))).model_dump()
    body["budget"] = budget_figures(exc)
    return JSONResponse(body, status_code=429, headers={"Retry-After": str(wait)})


def budget_figures(exc: BudgetExceeded) -> dict[str, Any]:
    """The `budget` object beside a 429 `budget_exceeded` error, in either error shape."""
    return {
        "team": exc.team,
        "unit": exc.limit.unit,
        "budget": exc.limit.amount,
        "spent": exc.spend.tokens if exc.limit.tokens is not None else exc.spend.cost,
        "period": exc.limit.period.value,
        "period_end": exc.ends.isoformat(),
    }


async def on_budget_refused(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BudgetRefused)
    return error_response(422, "invalid_request", str(exc), exc.param)


async def on_database_down(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", exc)
    return error_response(503, "database_unavailable", "the database is unavailable; retry shortly")


async def on_unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return error_response(500, "internal_error", "internal error; the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(JobNotFound, on_not_found)
    app.add_exception_handler(SweepNotFound, on_not_found)
    app.add_exception_handler(WebhookNotFound, on_not_found)
    app.add_exception_handler(TeamNotFound, on_not_found)
    app.add_exception_handler(IllegalTransition, on_conflict)
    app.add_exception_handler(IdempotencyMismatch, on_idempotency_mismatch)
    app.add_exception_handler(SpecRefused, on_spec_refused)
    app.add_exception_handler(SpecNotFound, on_spec_not_found)
    app.add_exception_handler(FileNotFound, on_not_found)
    app.add_exception_handler(FileInUse, on_conflict)
    app.add_exception_handler(FileRefused, on_file_refused)
    app.add_exception_handler(StorageUnavailable, on_storage_down)
    app.add_exception_handler(TooLargeToStore, on_too_large_to_store)
    app.add_exception_handler(TooManyWaiting, on_too_many_waiting)
    app.add_exception_handler(BudgetExceeded, on_budget_exceeded)
    app.add_exception_handler(StoredQuotaExceeded, on_stored_quota)
    app.add_exception_handler(BudgetRefused, on_budget_refused)
    app.add_exception_handler(OperationalError, on_database_down)
    app.add_exception_handler(InterfaceError, on_database_down)
    app.add_exception_handler(Exception, on_unexpected)
