"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, on the
OpenAI-compatible routes only (the rest of the API keeps its own envelope): their route
class turns every failure of a request, from its key to its worker, into that body, with
OpenAI's statuses (an invalid request is a 400, not a 422)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.errors import (
    STATUS_CODES,
    ApiError,
    ErrorDetail,
    body_type,
    budget_figures,
    describe_status,
    explain,
)
from app.budgets.errors import BudgetExceeded
from app.core.tables import utcnow
from app.core.waits import RETRY_AFTER_SECONDS, TooManyWaiting

log = logging.getLogger(__name__)

TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
"""OpenAI's error type by status: other 4xx are `invalid_request_error`, 5xx `server_error`."""

DESCRIPTIONS = {
    400: "Invalid request (`invalid_request_error`); `param` names the field.",
    404: "No such model, or its job is another team's (`model_not_found`).",
    504: "No worker answered within the deadline (`worker_timeout`).",
}


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(BaseModel):
    error: OpenAIErrorDetail


def error_type(status: int) -> str:
    return TYPES.get(status) or ("server_error" if status >= 500 else "invalid_request_error")


def openai_error(
    status: int,
    message: str,
    param: str | None = None,
    *,
    code: str | None,
    headers: dict[str, str] | None = None,
    beside: dict[str, Any] | None = None,
) -> JSONResponse:
    """OpenAI's error body, with `beside` (this service's figures, such as a 429's
    `budget`) next to `error`, where OpenAI's clients ignore it."""
    status = 400 if status == 422 else status
    detail = OpenAIErrorDetail(message=message, type=error_type(status), param=param, code=code)
    body = OpenAIErrorResponse(error=detail).model_dump() | (beside or {})
    return JSONResponse(body, status_code=status, headers=headers)


def model_not_found(model: str) -> ApiError:
    """The one answer for a model that is not there and for one of another team's."""
    message = f"The model `{model}` does not exist or you do not have access to it."
    return ApiError(404, "model_not_found", message, "model")


def openai_error_responses(*status_codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for these statuses and, as `4XX`, for any other refusal (which
    also keeps FastAPI from documenting a 422 these routes never send)."""
    described: dict[int | str, str] = {
        code: DESCRIPTIONS.get(code) or describe_status(code) for code in status_codes
    }
    described["4XX"] = "The request was refused; `error.message` says why."
    return {
        code: {"model": OpenAIErrorResponse, "description": description}
        for code, description in described.items()
    }


class OpenAIRoute(APIRoute):
    """A route whose failures all answer in OpenAI's error shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as error:
                return openai_error(
                    400, *explain(error, body_type(request)), code="invalid_request"
                )
            except ApiError as error:
                detail = error.detail
                return openai_error(
                    error.status_code,
                    detail.message,
                    detail.param,
                    code=detail.code,
                    headers=error.headers,
                )
            except BudgetExceeded as error:
                retry = {"Retry-After": str(error.retry_after(utcnow()))}
                return openai_error(
                    429,
                    str(error),
                    code="budget_exceeded",
                    headers=retry,
                    beside={"budget": budget_figures(error)},
                )
            except TooManyWaiting as error:
                retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
                return openai_error(429, str(error), code="too_many_requests", headers=retry)
            except StarletteHTTPException as error:
                message = error.detail if isinstance(error.detail, str) else "request refused"
                code = STATUS_CODES.get(error.status_code)
                return openai_error(error.status_code, message, code=code, headers=error.headers)
            except (OperationalError, InterfaceError) as error:
                log.warning("database unavailable: %s", error)
                message = "the database is unavailable; retry shortly"
                return openai_error(503, message, code="database_unavailable")
            except Exception as error:
                handler = handler_for(request, error)
                if handler is not None:  # a domain error the API answers (app/api/errors.py)
                    return in_openai_shape(await handler(request, error))
                log.error("unhandled error", exc_info=error)
                message = "internal error; the server log has the details"
                return openai_error(500, message, code="internal_error")

        return answer


Handler = Callable[[Request, Exception], Coroutine[Any, Any, Response]]


def handler_for(request: Request, error: Exception) -> Handler | None:
    """The app's handler of a domain error (a job or file not found, a spec refused, ...),
    by its class or the nearest it derives from; None for any other error."""
    handlers = request.app.exception_handlers
    return next((handlers[kind] for kind in type(error).__mro__ if kind in handlers), None)


def in_openai_shape(answer: Response) -> JSONResponse:
    """A refusal in the API's own shape as OpenAI's, with its status and headers."""
    detail = ErrorDetail.model_validate(json.loads(bytes(answer.body))["error"])
    kept = {name: value for name, value in answer.headers.items() if name.lower() == "retry-after"}
    return openai_error(
        answer.status_code, detail.message, detail.param, code=detail.code, headers=kept or None
    )
