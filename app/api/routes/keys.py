"""API keys (admin keys): list, create (the secret is shown once) and revoke."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Response

from app.api.deps import PrincipalDep, SessionDep, needs
from app.api.errors import ApiError, error_responses
from app.audit.store import record_audit
from app.auth.keys import create_key, list_keys, revoke_key
from app.auth.schemas import KeyCreate, KeyCreated, KeyPublic, KeysList, Scope
from app.core.tables import utcnow

router = APIRouter(
    prefix="/v1/keys", tags=["keys"], responses=error_responses(400, 401, 403, 413, 415, 422, 503)
)
ADMIN = needs(Scope.admin)


@router.get("", response_model=KeysList, openapi_extra=ADMIN)
async def read_keys(session: SessionDep, principal: PrincipalDep) -> KeysList:
    """Every key (prefixes only), oldest first."""
    return KeysList(
        data=[
            KeyPublic(
                prefix=key.prefix,
                team=team.name,
                scope=Scope(key.scope),
                created_at=key.created_at,
                expires_at=key.expires_at,
                revoked_at=key.revoked_at,
            )
            for key, team in await list_keys(session)
        ]
    )


@router.post("", status_code=201, response_model=KeyCreated, openapi_extra=ADMIN)
async def make_key(body: KeyCreate, session: SessionDep, principal: PrincipalDep) -> KeyCreated:
    """A new key for a team (created if new); the answer is the only copy of the secret."""
    expires = None
    if body.expires_in_days is not None:
        expires = utcnow() + timedelta(days=body.expires_in_days)
    new = await create_key(session, body.team, scope=body.scope, expires_at=expires, commit=False)
    target = f"key {new.api_key.prefix}"
    detail = {"team": body.team, "scope": body.scope.value}
    await record_audit(session, principal, "key.create", target, 201, detail)
    return KeyCreated(
        prefix=new.api_key.prefix,
        team=new.team.name,
        scope=body.scope,
        created_at=new.api_key.created_at,
        expires_at=expires,
        revoked_at=None,
        key=new.key,
    )


@router.delete("/{prefix}", status_code=204, openapi_extra=ADMIN, responses=error_responses(404))
async def delete_key(
    prefix: Annotated[str, Path(min_length=1, max_length=32)],
    session: SessionDep,
    principal: PrincipalDep,
) -> Response:
    """Revoke the key (API processes may trust it for OPD_AUTH_CACHE_SECONDS more)."""
    if not await revoke_key(session, prefix, commit=False):
        raise ApiError(404, "not_found", f"no live key with prefix {prefix!r}")
    await record_audit(session, principal, "key.revoke", f"key {prefix}", 204)
    return Response(status_code=204)
