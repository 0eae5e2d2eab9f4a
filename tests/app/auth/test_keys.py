"""Teams and API keys: shown once, stored as a hash, revocable."""

from __future__ import annotations

from sqlalchemy import select

from app.auth.keys import Principal, authenticate, create_key, hash_key, list_keys, revoke_key
from app.auth.schemas import Scope
from app.auth.tables import ApiKey
from app.core.cache import TTLCache
from app.core.db import standalone_session


async def test_a_key_is_stored_only_as_its_hash(session):
    new = await create_key(session, "auth-team-a")
    assert new.key.startswith(f"opd_{new.api_key.prefix}_")
    stored = (await session.execute(select(ApiKey).where(ApiKey.id == new.api_key.id))).scalar_one()
    assert stored.key_hash == hash_key(new.key)
    assert new.key not in {stored.key_hash, stored.prefix}


async def test_keys_authenticate_as_their_team(session):
    first = await create_key(session, "auth-team-b")
    second = await create_key(session, "auth-team-b", scope=Scope.admin)
    assert first.team.id == second.team.id, "a second key joins the existing team"
    assert await authenticate(session, first.key) == Principal(
        first.team.id, Scope.submit, first.api_key.prefix, team_name="auth-team-b"
    )
    assert await authenticate(session, second.key) == Principal(
        first.team.id, Scope.admin, second.api_key.prefix, team_name="auth-team-b"
    )
    assert (await authenticate(session, second.key)).scope is None, "admins see every team"
    assert await authenticate(session, first.key + "x") is None


async def test_revoked_keys_stop_working(session):
    new = await create_key(session, "auth-team-c")
    assert await revoke_key(session, new.api_key.prefix)
    assert not await revoke_key(session, new.api_key.prefix), "already revoked"
    assert await authenticate(session, new.key) is None
    listed = {api_key.prefix: (api_key, team) for api_key, team in await list_keys(session)}
    api_key, team = listed[new.api_key.prefix]
    assert api_key.revoked_at is not None and team.name == "auth-team-c"


async def test_the_cache_trusts_a_key_for_its_ttl(session):
    new = await create_key(session, "auth-team-d")
    cache = TTLCache[str, Principal](ttl=60)
    assert await authenticate(session, new.key, cache) is not None
    await revoke_key(session, new.api_key.prefix)
    assert await authenticate(session, new.key, cache) is not None, "cached"
    assert await authenticate(session, new.key) is None, "the database knows"


async def test_a_command_line_can_create_a_key_on_its_own_engine(database_url):
    async with standalone_session(database_url) as session:
        new = await create_key(session, "auth-team-cli")
    async with standalone_session(database_url) as session:
        assert await authenticate(session, new.key) == Principal(
            new.team.id, Scope.submit, new.api_key.prefix, team_name="auth-team-cli"
        )
