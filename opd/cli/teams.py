"""`opd teams list | set | budget`: the teams, their running and queued jobs, their limits
and budgets, over HTTP with an admin key (the service's prices and Redis are the ones that
count), else straight in the service's database (see `opd/cli/keys.py: ADMIN_HELP`).

The database layer is imported inside the command, to keep the other commands' start-up fast.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from app.budgets.schemas import BudgetPublic
from app.teams.schemas import TeamPublic
from opd.cli.common import (
    ADMIN_HELP,
    CommandError,
    admin_api,
    api_options,
    example,
    in_database,
    settings,
)
from opd.sdk import NotFound

if TYPE_CHECKING:
    from opd.cli.common import Commands
    from opd.sdk import Client


def limit_value(text: str) -> int | None:
    """A limit for `opd teams set`: a positive number, or `default`."""
    if text == "default":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of jobs (1 or more) or default")
    return int(text)


def budget_command(args: argparse.Namespace) -> int:
    """`opd teams budget TEAM`: show the team's budget, or set or remove it."""
    api = admin_api(args)
    if api is None:
        in_database("opd teams budget")
        return database_budget(args)
    with api:
        if args.remove:
            api.teams.delete_budget(args.team)
            print(f"Removed team {args.team!r}'s budget")
            return 0
        try:
            if args.tokens is not None or args.cost is not None:
                budget = api.teams.set_budget(
                    args.team,
                    tokens=args.tokens,
                    cost=args.cost,
                    soft=args.soft,
                    period=args.period,
                )
            else:
                budget = api.teams.budget(args.team)
        except NotFound as error:
            if not error.message.endswith("has no budget"):
                raise
            budget = None
    print("\n".join(budget_lines(args.team, budget)))
    return 0


def budget_lines(team: str, budget: BudgetPublic | None) -> list[str]:
    if budget is None:
        return [f"Team {team!r} has no budget: set one with --tokens N or --cost X"]
    amount = (lambda v: f"{v:,.0f} tokens") if budget.tokens is not None else "{:,.2f}".format
    total = budget.tokens if budget.tokens is not None else budget.cost
    lines = [
        f"team {budget.team}: {amount(budget.used)} of {amount(total)} this "
        f"{budget.period.value} ({budget.fraction:.0%}, {budget.state}); soft "
        f"{budget.soft:.0%}; the period ends {budget.period_end:%Y-%m-%d %H:%M} UTC"
    ]
    for day in budget.days:
        cost = "" if day.cost is None else f"  cost {day.cost:,.4f}"
        lines.append(f"  {day.day}  {day.tokens:>14,} tokens{cost}")
    return lines


class Resumed(logging.Handler):
    """The jobs a budget change resumed that this command could not send to the workers
    (it names no Redis): the workers' requeuer sends them."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.jobs.append(record.args[0] if isinstance(record.args, tuple) else record.args)


def database_budget(args: argparse.Namespace) -> int:
    # start-up time: the database layer
    import app.tables  # noqa: F401  (every table in the metadata before a flush)
    from app.audit.store import record_audit
    from app.budgets.errors import BudgetRefused
    from app.budgets.schemas import BudgetUpdate
    from app.budgets.service import budget_public, remove_budget, set_budget
    from app.budgets.store import team_named
    from app.core.db import migrate, standalone_session
    from app.core.pricing import PriceTable
    from app.core.queue import JobQueue
    from app.core.queue import log as queue_log
    from app.core.tables import utcnow

    config = settings()
    migrate(config.database_url)
    prices = PriceTable(config.prices)
    unsent = Resumed()
    queue_log.addHandler(unsent)
    queue_log.propagate = False  # said below, in the user's words

    async def act() -> int:
        queue = JobQueue(config.redis_url, config.queue_name)
        try:
            async with standalone_session(config.database_url) as session:
                team = await team_named(session, args.team)
                if team is None or team.id is None:
                    raise CommandError(f"no team named {args.team!r}")
                team_id, name = team.id, team.name
                target = f"team {name}"
                if args.remove:
                    if not await remove_budget(session, queue, team_id, prices, utcnow()):
                        raise CommandError(f"team {name!r} has no budget")
                    await record_audit(session, None, "team.budget", target, 204, None)
                    print(f"Removed team {name!r}'s budget")
                    return 0
                if args.tokens is not None or args.cost is not None:
                    try:
                        update = BudgetUpdate(
                            tokens=args.tokens, cost=args.cost, soft=args.soft, period=args.period
                        )
                        await set_budget(session, queue, team_id, update, prices, utcnow())
                    except BudgetRefused as error:
                        raise CommandError(f"{error}{prices_hint(error.param)}") from None
                    except ValueError as error:
                        raise CommandError(str(error)) from None
                    detail = update.model_dump(mode="json")
                    await record_audit(session, None, "team.budget", target, 200, detail)
                budget = await budget_public(session, team_id, prices, utcnow())
        finally:
            await queue.close()
        print("\n".join(budget_lines(name, budget)))
        return 0

    try:
        return asyncio.run(act())
    finally:
        queue_log.removeHandler(unsent)
        queue_log.propagate = True
        for jobs in unsent.jobs:
            print(
                f"Resumed jobs {jobs}: queued, and sent to the workers by their next requeue "
                "pass (OPD_REQUEUE_INTERVAL; this command reaches no Redis itself)",
                file=sys.stderr,
            )


def prices_hint(param: str | None) -> str:
    """Where a cost budget was refused for want of prices: the service may have them."""
    if param != "cost":
        return ""
    return (
        " (this shell has no OPD_PRICES; the service's own are used over HTTP: give --url "
        "and an admin --key, or OPD_URL and OPD_API_KEY)"
    )


def teams_command(args: argparse.Namespace) -> int:
    limits = ("max_running", "max_queued") if args.teams_action == "set" else ()
    changes = {name: getattr(args, name) for name in limits if getattr(args, name) is not ...}
    if args.teams_action == "set" and not changes:
        raise CommandError("give --max-running and/or --max-queued")
    api = admin_api(args)
    if api is None:
        in_database("opd teams")
        teams = database_teams(args, changes)
    else:
        with api:
            teams = http_teams(args, api, changes)
    print("\n".join(team_lines(teams)))
    return 0


def http_teams(args: argparse.Namespace, api: Client, changes: dict[str, Any]) -> list[TeamPublic]:
    if args.teams_action == "set":
        try:
            return [api.teams.update(args.name, **changes)]
        except NotFound:
            raise CommandError(f"no team named {args.name!r}") from None
    return api.teams.list()


def team_lines(teams: Iterable[TeamPublic]) -> list[str]:
    def shown(own: int | None, effective: int | None) -> str:
        value = "none" if effective is None else str(effective)
        return value if own is not None else f"{value} (default)"

    lines = [f"{'team':<24} {'running':>8} {'queued':>7}  {'max running':<16} max queued"]
    for team in teams:
        lines.append(
            f"{team.name:<24} {team.running:>8} {team.queued:>7}  "
            f"{shown(team.max_running, team.effective_max_running):<16} "
            f"{shown(team.max_queued, team.effective_max_queued)}"
        )
    return lines if len(lines) > 1 else ["no teams (opd keys create --team NAME makes one)"]


def database_teams(args: argparse.Namespace, changes: dict[str, Any]) -> list[TeamPublic]:
    # start-up time: the database layer
    import app.tables  # noqa: F401  (every table in the metadata before a flush)
    from app.audit.store import record_audit
    from app.core.db import migrate, standalone_session
    from app.jobs.limits import Limits
    from app.teams.store import TeamNotFound, list_teams, set_limits

    config = settings()
    migrate(config.database_url)
    limits = Limits.of(config)

    async def act() -> list[TeamPublic]:
        async with standalone_session(config.database_url) as session:
            if args.teams_action == "set":
                try:
                    await set_limits(session, args.name, changes, limits, commit=False)
                except TeamNotFound as error:
                    raise CommandError(str(error)) from None
                await record_audit(session, None, "team.limits", f"team {args.name}", 200, changes)
            teams = await list_teams(
                session, limits, args.name if args.teams_action == "set" else None
            )
        return [TeamPublic.model_validate(team) for team in teams]

    return asyncio.run(act())


def add_parsers(commands: Commands) -> None:
    http = api_options()
    teams = commands.add_parser("teams", help="teams and their limits", description=ADMIN_HELP)
    team_actions = teams.add_subparsers(dest="teams_action", required=True, metavar="ACTION")
    listing = team_actions.add_parser(
        "list",
        parents=[http],
        help="every team: jobs running and queued, limits",
        description=ADMIN_HELP,
    )
    example(listing, "opd teams list")
    team_set = team_actions.add_parser(
        "set",
        parents=[http],
        help="set a team's limits (default: the service's)",
        description=ADMIN_HELP,
    )
    team_set.add_argument("name", help="the team's name")
    team_set.add_argument(
        "--max-running",
        type=limit_value,
        default=...,
        metavar="N|default",
        help="jobs the team may run at once (default: OPD_TEAM_MAX_RUNNING)",
    )
    team_set.add_argument(
        "--max-queued",
        type=limit_value,
        default=...,
        metavar="N|default",
        help="jobs the team may keep queued (default: OPD_TEAM_MAX_QUEUED)",
    )
    example(team_set, "opd teams set beta --max-running 2 --max-queued default")
    teams.set_defaults(handler=teams_command)
    budget = team_actions.add_parser(
        "budget",
        parents=[http],
        help="a team's budget: show it (spend so far, per day), set it, or remove it",
        description="Past the soft share the team's webhooks get budget.threshold; at the "
        "limit new jobs are refused (429 budget_exceeded) and running jobs pause at their "
        "next step boundary, resuming by themselves when the budget is raised or the "
        f"period turns. {ADMIN_HELP}",
    )
    budget.add_argument("team", help="the team's name or id")
    amount = budget.add_mutually_exclusive_group()
    amount.add_argument(
        "--tokens", type=int, help="tokens a period (sampled, scored, trained and evaluated)"
    )
    amount.add_argument("--cost", type=float, help="or a cost a period, from OPD_PRICES")
    amount.add_argument("--remove", action="store_true", help="remove the budget")
    budget.add_argument("--soft", type=float, default=0.8, help="the share warned at (0.8)")
    budget.add_argument(
        "--period", choices=["month", "week", "day"], default="month", help="UTC (month)"
    )
    example(budget, "opd teams budget beta --tokens 200000")
    budget.set_defaults(handler=budget_command)
