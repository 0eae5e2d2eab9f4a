"""`opd keys create | list | revoke`: the teams' API keys, over HTTP with an admin key
(`--url`/`--key`, OPD_URL/OPD_API_KEY, or `opd serve`'s local key while its service runs),
else straight in the service's database (no API key is needed to make the first one).

The database layer is imported inside the command, to keep the other commands' start-up fast.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from app.auth.schemas import KeyPublic, Scope
from opd.cli.common import (
    ADMIN_HELP,
    CommandError,
    admin_api,
    api_options,
    duration,
    example,
    in_database,
    settings,
)

if TYPE_CHECKING:
    from opd.cli.common import Commands
    from opd.sdk import Client


def keys_command(args: argparse.Namespace) -> int:
    api = admin_api(args)
    if api is not None:
        with api:
            return http_keys(args, api)
    in_database("opd keys")
    return database_keys(args)


def scope_of(args: argparse.Namespace) -> Scope:
    return Scope.admin if args.admin else Scope(args.scope)


def whole_days(expires: timedelta | None) -> int | None:
    """`--expires` as the API takes it: whole days."""
    if expires is None:
        return None
    days, rest = divmod(expires, timedelta(days=1))
    if rest or not days:
        raise CommandError(
            "over HTTP a key expires after whole days: give --expires in days or weeks (e.g. 1d)"
        )
    return days


def http_keys(args: argparse.Namespace, api: Client) -> int:
    if args.keys_action == "create":
        new = api.keys.create(
            args.team, scope=scope_of(args), expires_in_days=whole_days(args.expires)
        )
        print(new.key)
        print(created_note(new, f"by the service at {api.http.base_url}"), file=sys.stderr)
    elif args.keys_action == "list":
        print("\n".join(key_lines(api.keys.list(), datetime.now(UTC))))
    else:
        api.keys.revoke(args.prefix)
    return 0


def created_note(new: KeyPublic, where: str) -> str:
    until = f", expires {new.expires_at:%Y-%m-%d %H:%M} UTC" if new.expires_at else ""
    return (
        f"Key for team {new.team!r} (scope {new.scope.value}{until}) made {where}; it is "
        "shown only this once."
    )


def key_lines(keys: Iterable[KeyPublic], now: datetime) -> list[str]:
    lines = []
    for key in keys:
        state = "revoked" if key.revoked_at else "active"
        if key.expires_at is not None and not key.revoked_at:
            state = "expired" if key.expires_at <= now else "active"
            state += f" (until {key.expires_at:%Y-%m-%d %H:%M} UTC)"
        lines.append(f"{key.prefix}  team={key.team}  scope={key.scope.value}  {state}")
    return lines or ["no keys (opd keys create --team NAME)"]


def database_keys(args: argparse.Namespace) -> int:
    # start-up time: the database layer
    import app.tables  # noqa: F401  (every table in the metadata before a flush)
    from app.audit.store import record_audit
    from app.auth.keys import create_key, list_keys, revoke_key
    from app.core.db import migrate, standalone_session
    from app.core.tables import utcnow

    url = settings().database_url
    migrate(url)

    async def act() -> int:
        async with standalone_session(url) as session:
            if args.keys_action == "create":
                scope = scope_of(args)
                expires = utcnow() + args.expires if args.expires else None
                new = await create_key(
                    session, args.team, scope=scope, expires_at=expires, commit=False
                )
                target = f"key {new.api_key.prefix}"
                detail = {"team": args.team, "scope": scope.value}
                await record_audit(session, None, "key.create", target, 201, detail)
                print(new.key)
                made = KeyPublic(
                    prefix=new.api_key.prefix,
                    team=args.team,
                    scope=scope,
                    created_at=new.api_key.created_at,
                    expires_at=expires,
                    revoked_at=None,
                )
                print(
                    created_note(made, f"in the database {shown_url(url)}")
                    + " A service reading another database (OPD_HOME, OPD_DATABASE_URL) "
                    "refuses it.",
                    file=sys.stderr,
                )
            elif args.keys_action == "list":
                keys = [
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
                print("\n".join(key_lines(keys, utcnow())))
            elif await revoke_key(session, args.prefix, commit=False):
                await record_audit(session, None, "key.revoke", f"key {args.prefix}", 204)
            else:
                raise CommandError(f"no key with prefix {args.prefix!r}")
        return 0

    return asyncio.run(act())


def shown_url(url: str) -> str:
    """A database URL as a person reads it: a SQLite file as its absolute path, a server
    without its password."""
    from sqlalchemy.engine import make_url  # start-up time: the database layer

    parsed = make_url(url)
    if parsed.drivername.startswith("sqlite") and parsed.database:
        return str(Path(parsed.database).resolve())
    return parsed.render_as_string(hide_password=True)


def add_parsers(commands: Commands) -> None:
    http = api_options()
    keys = commands.add_parser("keys", help="API keys of teams", description=ADMIN_HELP)
    key_actions = keys.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    create = key_actions.add_parser(
        "create", parents=[http], help="make a key (printed once)", description=ADMIN_HELP
    )
    create.add_argument("--team", required=True, help="the team's name (made if new)")
    create.add_argument(
        "--scope",
        choices=["read", "submit", "admin"],
        default="submit",
        help="read: GET only; submit: also create and act on the team's jobs (default); "
        "admin: every team, keys, teams' limits",
    )
    create.add_argument("--admin", action="store_true", help="the same as --scope admin")
    create.add_argument(
        "--expires", type=duration, metavar="90d", help="the key stops working then"
    )
    example(create, "opd keys create --team beta --scope read --expires 90d")
    listing = key_actions.add_parser(
        "list", parents=[http], help="list keys (prefixes only)", description=ADMIN_HELP
    )
    example(listing, "opd keys list")
    revoke = key_actions.add_parser(
        "revoke", parents=[http], help="revoke a key by its prefix", description=ADMIN_HELP
    )
    example(revoke, "opd keys revoke PREFIX")
    revoke.add_argument("prefix", help="the key's prefix, as `opd keys list` shows it")
    keys.set_defaults(handler=keys_command)
