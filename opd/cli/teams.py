"""`opd teams list | set`: the teams, their running and queued jobs, and their limits,
straight in the database.

The database layer is imported inside the command, to keep the other commands' start-up fast.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from opd.cli.common import CommandError, settings

if TYPE_CHECKING:
    from opd.cli.common import Commands


def limit_value(text: str) -> int | None:
    """A limit for `opd teams set`: a positive number, or `default`."""
    if text == "default":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of jobs (1 or more) or default")
    return int(text)


def teams_command(args: argparse.Namespace) -> int:
    # start-up time: the database layer
    import app.tables  # noqa: F401  (every table in the metadata before a flush)
    from app.audit.store import record_audit
    from app.core.db import migrate, standalone_session
    from app.jobs.limits import Limits
    from app.teams.store import TeamNotFound, list_teams, set_limits

    config = settings()
    migrate(config.database_url)
    limits = Limits.of(config)

    def shown(own: int | None, effective: int | None) -> str:
        value = "none" if effective is None else str(effective)
        return value if own is not None else f"{value} (default)"

    async def act() -> int:
        async with standalone_session(config.database_url) as session:
            if args.teams_action == "set":
                changes = {
                    name: getattr(args, name)
                    for name in ("max_running", "max_queued")
                    if getattr(args, name) is not ...
                }
                if not changes:
                    raise CommandError("give --max-running and/or --max-queued")
                try:
                    await set_limits(session, args.name, changes, limits, commit=False)
                except TeamNotFound as error:
                    raise CommandError(str(error)) from None
                await record_audit(session, None, "team.limits", f"team {args.name}", 200, changes)
            teams = await list_teams(
                session, limits, args.name if args.teams_action == "set" else None
            )
        if not teams:
            print("no teams (opd keys create --team NAME makes one)")
            return 0
        print(f"{'team':<24} {'running':>8} {'queued':>7}  {'max running':<16} max queued")
        for team in teams:
            print(
                f"{team.name:<24} {team.running:>8} {team.queued:>7}  "
                f"{shown(team.max_running, team.effective_max_running):<16} "
                f"{shown(team.max_queued, team.effective_max_queued)}"
            )
        return 0

    return asyncio.run(act())


def add_parsers(commands: Commands) -> None:
    teams = commands.add_parser("teams", help="teams and their limits")
    team_actions = teams.add_subparsers(dest="teams_action", required=True, metavar="ACTION")
    team_actions.add_parser("list", help="every team: jobs running and queued, limits")
    team_set = team_actions.add_parser("set", help="set a team's limits (default: the service's)")
    team_set.add_argument("name")
    for flag in ("--max-running", "--max-queued"):
        team_set.add_argument(flag, type=limit_value, default=..., metavar="N|default")
    teams.set_defaults(handler=teams_command)
