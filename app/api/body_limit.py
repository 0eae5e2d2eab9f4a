"""Rejects request bodies over the configured size with a 413, an API body that is not JSON
(YAML, or no content type) with a 415, and JSON bodies holding NaN or Infinity with a 422,
before any route reads them."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import error_response
from app.api.finite_json import non_finite_field


class BodyLimitMiddleware:
    """Buffers at most `max_bytes` of a request body; a declared or actual larger body is
    answered with 413 without reaching the app, a JSON body with NaN or Infinity in it with
    422 naming where. The buffered body is replayed to the app."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, streamed: frozenset[tuple[str, str]] = frozenset()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.streamed = streamed
        """(method, path) of the routes that read their body as a stream and bound it
        themselves (POST /v1/files: a file up to OPD_MAX_UPLOAD_BYTES)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) in self.streamed:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body: Message | None = {"type": "http.request", "body": b"".join(chunks)}
        if body["body"] and (refusal := unsupported_media(scope)) is not None:
            await error_response(415, "unsupported_media_type", refusal)(scope, receive, send)
            return
        if is_json(scope) and (field := non_finite_field(body["body"])) is not None:
            message = f"{field}: NaN and Infinity are not JSON numbers; give a finite number"
            await error_response(422, "invalid_request", message, field)(scope, receive, send)
            return

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413, "body_too_large", f"the request body is larger than {self.max_bytes} bytes"
        )
        await response(scope, receive, send)


YAML_TYPES = {b"text/yaml", b"application/yaml", b"application/x-yaml", b"text/x-yaml"}


def unsupported_media(scope: Scope) -> str | None:
    """Why the API refuses a body it would not read as JSON (None: it reads it). The API's
    routes take JSON only; a body in YAML or without a content type would otherwise reach
    a route as a string and be refused field by field. The dashboard's forms are its own."""
    if scope["method"] not in BODY_METHODS or not scope["path"].startswith(API_PREFIX):
        return None
    content_type = dict(scope["headers"]).get(b"content-type")
    media = None if content_type is None else content_type.split(b";")[0].strip().lower()
    if media is not None and (media == b"application/json" or media.endswith(b"+json")):
        return None
    sent = "no Content-Type" if media is None else media.decode(errors="replace")
    message = f"the API reads JSON bodies: send Content-Type: application/json (this had {sent})"
    if media in YAML_TYPES:
        message += (
            "; a YAML spec or sweep is read by `opd submit FILE`, `opd sweep create FILE` "
            "and the SDK's load_spec, which send it as JSON"
        )
    return message


BODY_METHODS = {"POST", "PUT", "PATCH"}
API_PREFIX = "/v1/"


def is_json(scope: Scope) -> bool:
    """Whether the routes read the body as JSON (they do when no content type is given)."""
    content_type = dict(scope["headers"]).get(b"content-type", b"application/json")
    media = content_type.split(b";")[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")
