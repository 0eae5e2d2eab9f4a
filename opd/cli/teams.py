"""`opd teams list | set | budget`: the teams, their running and queued jobs, their limits
and budgets, straight in the database.

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


def budget_command(args: argparse.Namespace) -> int:
    """`opd teams budget TEAM`: show the team's budget, or set or remove it."""
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
    from app.core.tables import utcnow

    config = settings()
    migrate(config.database_url)
    prices = PriceTable(config.prices)
    if args.tokens is not None and args.cost is not None:
        raise CommandError("give --tokens or --cost, not both")

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
                    except (BudgetRefused, ValueError) as error:
                        raise CommandError(str(error)) from None
                    detail = update.model_dump(mode="json")
                    await record_audit(session, None, "team.budget", target, 200, detail)
                budget = await budget_public(session, team_id, prices, utcnow())
        finally:
            await queue.close()
        if budget is None:
            print(f"Team {name!r} has no budget: set one with --tokens N or --cost X")
            return 0
        amount = (lambda v: f"{v:,.0f} tokens") if budget.tokens is not None else "{:,.2f}".format
        total = budget.tokens if budget.tokens is not None else budget.cost
        print(
            f"team {budget.team}: {amount(budget.used)} of {amount(total)} this "
            f"{budget.period.value} ({budget.fraction:.0%}, {budget.state}); soft "
            f"{budget.soft:.0%}; the period ends {budget.period_end:%Y-%m-%d %H:%M} UTC"
        )
        for day in budget.days:
            cost = "" if day.cost is None else f"  cost {day.cost:,.4f}"
            print(f"  {day.day}  {day.tokens:>14,} tokens{cost}")
        return 0

    return asyncio.run(act())


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
    budget = team_actions.add_parser(
        "budget",
        help="a team's budget: show it (spend so far, per day), set it, or remove it",
        description="Past the soft share the team's webhooks get budget.threshold; at the "
        "limit new jobs are refused (429 budget_exceeded) and running jobs pause at their "
        "next step boundary, resuming by themselves when the budget is raised or the "
        "period turns.",
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
    budget.set_defaults(handler=budget_command)
