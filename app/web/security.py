"""What keeps the dashboard's pages safe: security headers (a strict Content-Security-Policy:
no inline script or style, nothing from another origin), the session and nonce cookies,
and the CSRF check every state-changing form passes."""

from __future__ import annotations

import time

from fastapi import Request, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.auth.sessions import NONCE_COOKIE, SESSION_COOKIE, SessionSigner, new_nonce

DASHBOARD_PREFIX = "/ui"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


class SecurityHeadersMiddleware:
    """Adds the headers to every dashboard response (and leaves the JSON API as it is)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_dashboard_path(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def is_dashboard_path(path: str) -> bool:
    return path == "/" or path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/")


def signer(request: Request) -> SessionSigner:
    return request.app.state.session_signer


def browser_nonce(request: Request) -> str:
    """This browser's CSRF nonce: its cookie, or a new one that `remember_nonce` sets."""
    nonce = request.cookies.get(NONCE_COOKIE) or getattr(request.state, "new_nonce", None)
    if nonce is None:
        nonce = request.state.new_nonce = new_nonce()
    return nonce


def csrf_token(request: Request) -> str:
    return signer(request).csrf_token(browser_nonce(request), session_token(request))


def session_token(request: Request) -> str:
    return request.cookies.get(SESSION_COOKIE, "")


def cookie_options(request: Request) -> dict[str, object]:
    return {
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
        "path": "/",
    }


def remember_nonce(request: Request, response: Response) -> None:
    """Set the nonce cookie when this request made a new nonce."""
    nonce = getattr(request.state, "new_nonce", None)
    if nonce is not None:
        response.set_cookie(NONCE_COOKIE, nonce, **cookie_options(request))  # type: ignore[arg-type]


def start_session(request: Request, response: Response, key_hash: str) -> None:
    lifetime = signer(request).lifetime
    token = signer(request).issue(key_hash, time.time())
    response.set_cookie(SESSION_COOKIE, token, max_age=int(lifetime), **cookie_options(request))  # type: ignore[arg-type]


def end_session(request: Request, response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, **cookie_options(request))  # type: ignore[arg-type]
