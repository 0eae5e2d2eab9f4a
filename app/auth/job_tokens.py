"""Job tokens: how a worker calls this service's own `/v1/completions` for a job whose
teacher server is the service itself (OPD_TEACHER_SERVERS binds its URL to `self`), on
behalf of the job's own team, with no key in the worker's environment.

A token is `opdjob_<payload>.<signature>`, both URL-safe base64: the payload is
`{"t": team id, "j": job id, "e": expiry (unix seconds)}`, the signature an HMAC-SHA256
under a key derived from OPD_SECRET_KEY (which API and workers already share to open
webhook secrets). The worker mints one per request, valid for minutes; the API accepts
it on `POST /v1/completions` only, as the job's team (never as admin), while the job has
not ended (app/api/job_tokens.py).
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass

from app.auth.sessions import b64decode, b64encode, same_digest
from app.core.config import Settings
from app.core.encryption import secret_keys

JOB_TOKEN_PREFIX = "opdjob_"
JOB_TOKEN_SECONDS = 900
"""How long a job token lasts: a worker mints a fresh one for every request."""
PURPOSE = b"opd job token|"


@dataclass(frozen=True)
class JobClaims:
    """Who a genuine token speaks for: a job, and the team that owns it."""

    team_id: int
    job_id: int


@dataclass(frozen=True)
class JobTokens:
    """Mints tokens under the first key, accepts them under any (key rotation)."""

    keys: tuple[bytes, ...]

    @classmethod
    def of(cls, settings: Settings) -> JobTokens:
        """The keys derived from OPD_SECRET_KEY (else the key kept in <home>)."""
        return cls(
            tuple(hashlib.sha256(PURPOSE + key.encode()).digest() for key in secret_keys(settings))
        )

    def issue(self, team_id: int, job_id: int, now: float) -> str:
        """A token for job `job_id` of team `team_id`, valid JOB_TOKEN_SECONDS from `now`."""
        claims = {"t": team_id, "j": job_id, "e": int(now + JOB_TOKEN_SECONDS)}
        payload = b64encode(json.dumps(claims, separators=(",", ":")).encode())
        return f"{JOB_TOKEN_PREFIX}{payload}.{self.sign(self.keys[0], payload)}"

    def read(self, token: str, now: float) -> JobClaims | None:
        """The claims of a genuine, unexpired token; None for anything else."""
        payload, _, signature = token.removeprefix(JOB_TOKEN_PREFIX).partition(".")
        if not any(same_digest(signature, self.sign(key, payload)) for key in self.keys):
            return None
        try:
            claims = json.loads(b64decode(payload))
        except (ValueError, binascii.Error):
            return None
        if not isinstance(claims, dict):
            return None
        team, job, expiry = claims.get("t"), claims.get("j"), claims.get("e")
        if not all(isinstance(value, int) for value in (team, job, expiry)) or now >= expiry:
            return None
        return JobClaims(team, job)

    @staticmethod
    def sign(key: bytes, payload: str) -> str:
        return b64encode(hmac.new(key, payload.encode(), hashlib.sha256).digest())


def is_job_token(key: str) -> bool:
    return key.startswith(JOB_TOKEN_PREFIX)
