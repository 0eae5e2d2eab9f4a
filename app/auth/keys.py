"""Teams and their API keys: keys are shown once at creation and stored only as a hash.

A key looks like `opd_<prefix>_<secret>`. The prefix is public (it names the key in
listings); the SHA-256 of the whole key is what authenticates it. Keys are random
and long, so a fast hash is as safe as a slow one here.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import select

from app.auth.schemas import Scope
from app.auth.tables import ApiKey, Team
from app.core.cache import TTLCache
from app.core.db import commit_or_flush
from app.core.tables import utcnow

KEY_PREFIX = "opd"


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: one team, or every team for an admin key; what the key may
    do (`key_scope`), and its public prefix for the audit log."""

    team_id: int
    key_scope: Scope = Scope.submit
    key_prefix: str | None = None
    expires_at: datetime | None = None
    team_name: str = ""
    job_id: int | None = None
    """A job token's job: a worker scoring for it (app/auth/job_tokens.py)."""

    @property
    def is_admin(self) -> bool:
        return self.key_scope is Scope.admin

    @property
    def scope(self) -> int | None:
        """The team whose jobs the caller sees; None = every team."""
        return None if self.is_admin else self.team_id

    def allows(self, needed: Scope) -> bool:
        return self.key_scope.allows(needed)

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


@dataclass(frozen=True)
class NewKey:
    """A freshly created key; `key` is the only copy of the secret."""

    team: Team
    api_key: ApiKey
    key: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> tuple[str, str]:
    """A new random key and its public prefix."""
    prefix = secrets.token_hex(4)
    return f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}", prefix


async def get_or_create_team(session: AsyncSession, name: str) -> Team:
    team = (await session.execute(select(Team).where(Team.name == name))).scalar_one_or_none()
    if team is None:
        team = Team(name=name)
        session.add(team)
        await session.flush()
    return team


async def create_key(
    session: AsyncSession,
    team_name: str,
    *,
    scope: Scope = Scope.submit,
    expires_at: datetime | None = None,
    commit: bool = True,
) -> NewKey:
    """Create a key for `team_name` (creating the team if new); commits unless told not to
    (commit=False: the caller commits)."""
    team = await get_or_create_team(session, team_name)
    key, prefix = generate_key()
    api_key = ApiKey(
        team_id=team.id,
        prefix=prefix,
        key_hash=hash_key(key),
        scope=scope,
        expires_at=expires_at,
    )
    session.add(api_key)
    await commit_or_flush(session, commit)
    return NewKey(team=team, api_key=api_key, key=key)


async def revoke_key(session: AsyncSession, prefix: str, *, commit: bool = True) -> bool:
    """Revoke the key with this public prefix (commit=False: the caller commits); False if
    there is no such live key."""
    api_key = (
        await session.execute(
            select(ApiKey).where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))
        )
    ).scalar_one_or_none()
    if api_key is None:
        return False
    api_key.revoked_at = utcnow()
    await commit_or_flush(session, commit)
    return True


async def list_keys(session: AsyncSession) -> list[tuple[ApiKey, Team]]:
    """Every key with its team, oldest first (hashes only; secrets are never stored)."""
    rows = await session.execute(
        select(ApiKey, Team).join(Team, ApiKey.team_id == Team.id).order_by(ApiKey.id)
    )
    return [(api_key, team) for api_key, team in rows.all()]


async def authenticate(
    session: AsyncSession, key: str, cache: TTLCache[str, Principal] | None = None
) -> Principal | None:
    """The principal a presented key acts for, or None for an unknown or revoked key (an
    expired key's principal says so: `expired`). With a cache, an accepted key is trusted
    for the cache's ttl (a revoked key keeps working in that process for at most that long)."""
    return await authenticate_hash(session, hash_key(key), cache)


async def authenticate_hash(
    session: AsyncSession, key_hash: str, cache: TTLCache[str, Principal] | None = None
) -> Principal | None:
    """`authenticate` for a key known by its hash (a dashboard session names its key so)."""
    if cache is not None and (principal := cache.get(key_hash)) is not None:
        return principal
    row = (
        await session.execute(
            select(ApiKey.team_id, ApiKey.scope, ApiKey.prefix, ApiKey.expires_at, Team.name)
            .join(Team, Team.id == ApiKey.team_id)
            .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
        )
    ).one_or_none()
    if row is None:
        return None
    principal = Principal(row.team_id, Scope(row.scope), row.prefix, row.expires_at, row.name)
    if cache is not None:
        cache.put(key_hash, principal)
    return principal
