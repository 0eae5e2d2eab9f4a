"""`opd keys create | list | revoke`: the teams' API keys, straight in the database (no API
key is needed to make the first one).

The database layer is imported inside the command, to keep the other commands' start-up fast.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from opd.cli.common import CommandError, duration, settings

if TYPE_CHECKING:
    from opd.cli.common import Commands


def keys_command(args: argparse.Namespace) -> int:
    # start-up time: the database layer
    import app.tables  # noqa: F401  (every table in the metadata before a flush)
    from app.audit.store import record_audit
    from app.auth.keys import create_key, list_keys, revoke_key
    from app.auth.schemas import Scope
    from app.core.db import migrate, standalone_session
    from app.core.tables import utcnow

    url = settings().database_url
    migrate(url)

    async def act() -> int:
        async with standalone_session(url) as session:
            if args.keys_action == "create":
                scope = Scope.admin if args.admin else Scope(args.scope)
                expires = utcnow() + args.expires if args.expires else None
                new = await create_key(
                    session, args.team, scope=scope, expires_at=expires, commit=False
                )
                target = f"key {new.api_key.prefix}"
                detail = {"team": args.team, "scope": scope.value}
                await record_audit(session, None, "key.create", target, 201, detail)
                print(new.key)
                until = f", expires {expires:%Y-%m-%d %H:%M} UTC" if expires else ""
                print(
                    f"Key for team {args.team!r} (scope {scope.value}{until}) in the database "
                    f"{shown_url(url)}; it is shown only this once. A service reading another "
                    "database (OPD_HOME, OPD_DATABASE_URL) refuses it.",
                    file=sys.stderr,
                )
            elif args.keys_action == "list":
                now = utcnow()
                keys = await list_keys(session)
                if not keys:
                    print("no keys (opd keys create --team NAME)")
                for key, team in keys:
                    state = "revoked" if key.revoked_at else "active"
                    if key.expires_at is not None and not key.revoked_at:
                        state = "expired" if key.expires_at <= now else "active"
                        state += f" (until {key.expires_at:%Y-%m-%d %H:%M} UTC)"
                    print(f"{key.prefix}  team={team.name}  scope={key.scope}  {state}")
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
    keys = commands.add_parser("keys", help="API keys of teams")
    key_actions = keys.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    create = key_actions.add_parser("create", help="make a key (printed once)")
    create.add_argument("--team", required=True)
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
    key_actions.add_parser("list", help="list keys (prefixes only)")
    revoke = key_actions.add_parser("revoke", help="revoke a key by its prefix")
    revoke.add_argument("prefix")
    keys.set_defaults(handler=keys_command)
