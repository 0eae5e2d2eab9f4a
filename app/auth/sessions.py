"""Browser sessions for the dashboard: a signed, expiring cookie that names an API key by
its hash. The key itself never reaches the browser's storage, and revoking the key ends
every session made with it.

A session token is `payload.signature`, both URL-safe base64: the payload is
`{"h": key_hash, "e": expiry (unix seconds)}`, the signature an HMAC-SHA256 under the
service's session secret. CSRF tokens are HMACs too, bound to a per-browser nonce and to
the session, so a token taken from one browser is worthless in another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.keys import Principal, authenticate_hash
from app.core.config import Settings
from app.core.home_secrets import home_secret

SESSION_COOKIE = "opd_session"
NONCE_COOKIE = "opd_nonce"
SECRET_FILE = "session-secret"


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def same_digest(given: str, expected: str) -> bool:
    """Whether a digest the caller sent is the expected one, in constant time. Compared as
    bytes: `compare_digest` raises on a `str` with non-ASCII characters, and a header or
    cookie may carry any."""
    return hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True)
class SessionSigner:
    """Issues and checks session and CSRF tokens with one secret."""

    secret: bytes
    lifetime: float

    def _mac(self, purpose: str, message: str) -> str:
        digest = hmac.new(self.secret, f"{purpose}|{message}".encode(), hashlib.sha256)
        return b64encode(digest.digest())

    def issue(self, key_hash: str, now: float) -> str:
        """A token for the key with this hash, valid for `lifetime` seconds from `now`."""
        body = json.dumps({"h": key_hash, "e": int(now + self.lifetime)}, separators=(",", ":"))
        payload = b64encode(body.encode())
        return f"{payload}.{self._mac('session', payload)}"

    def read(self, token: str, now: float) -> str | None:
        """The key hash a genuine, unexpired token names; None for anything else."""
        payload, _, signature = token.partition(".")
        if not same_digest(signature, self._mac("session", payload)):
            return None
        try:
            claims = json.loads(b64decode(payload))
        except (ValueError, binascii.Error):
            return None
        if not isinstance(claims, dict) or not isinstance(claims.get("e"), int):
            return None
        key_hash = claims.get("h")
        return key_hash if isinstance(key_hash, str) and now < claims["e"] else None

    def csrf_token(self, nonce: str, session_token: str) -> str:
        """The token every state-changing form of this browser (and session) must carry."""
        return self._mac("csrf", f"{nonce}|{session_token}")

    def csrf_valid(self, token: str, nonce: str, session_token: str) -> bool:
        return bool(nonce) and same_digest(token, self.csrf_token(nonce, session_token))


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def load_secret(settings: Settings) -> bytes:
    """OPD_SESSION_SECRET, else a random secret made once and kept in <home>, so that API
    processes sharing the home (and restarts) accept each other's sessions."""
    if settings.session_secret is not None:
        return settings.session_secret.get_secret_value().encode()
    return home_secret(settings.home / SECRET_FILE, lambda: secrets.token_urlsafe(48)).encode()


async def session_principal(
    request: Request, session: AsyncSession, now: float
) -> Principal | None:
    """Who the request's session cookie signs in, or None (no cookie, forged, expired, or
    its key revoked or expired)."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return None
    key_hash = request.app.state.session_signer.read(token, now)
    if key_hash is None:
        return None
    principal = await authenticate_hash(session, key_hash, request.app.state.principals)
    if principal is None or principal.expired(datetime.fromtimestamp(now, UTC)):
        return None
    return principal
