"""`opd usage`: the tokens a team's jobs used, per job or per day, and what they cost."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from opd.cli.common import api_options, client, deprecation_note, duration, example

if TYPE_CHECKING:
    from opd.cli.common import Commands


def day_or_age(text: str) -> date:
    """`--since`: a UTC day (2026-11-01), or an age (7d, 12h, 2w) before now."""
    try:
        return date.fromisoformat(text)
    except ValueError:
        pass
    try:
        return (datetime.now(UTC) - duration(text)).date()
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a day (2026-11-01) or an age (7d, 12h, 2w)"
        ) from None


def day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a day, e.g. 2026-11-30") from None


def usage_command(args: argparse.Namespace) -> int:
    if args.old_by is not None:
        deprecation_note("opd usage --by", "--group-by")
        args.group_by = args.old_by
    report = client(args).usage.get(
        since=args.since, until=args.until, group_by=args.group_by, team=args.team
    )
    print(
        f"{'team':<16} {args.group_by:<28} {'sampled':>12} {'teacher':>12} {'trained':>12} "
        f"{'eval':>10} {'est. cost':>10}"
    )
    rows = [(row.team, row) for row in report.rows] + [("total", report.total)]
    for team, row in rows:
        if args.group_by == "day":
            what = str(getattr(row, "day", None) or "")
        else:
            job_id, name = getattr(row, "job_id", None), getattr(row, "job_name", None)
            what = f"{job_id or ''} {name or ''}".strip()
        cost = row.estimated_cost
        print(
            f"{team:<16} {what:<28} {row.sampled_tokens:>12,} "
            f"{row.teacher_tokens:>12,} {row.trained_tokens:>12,} {row.eval_tokens:>10,} "
            f"{'-' if cost is None else f'{cost:.2f}':>10}"
        )
    if not report.priced:
        print("No price table is set (OPD_PRICES), so no cost is shown.", file=sys.stderr)
    return 0


def add_parsers(commands: Commands) -> None:
    http = api_options()
    usage = commands.add_parser("usage", parents=[http], help="tokens used, per job or per day")
    usage.add_argument(
        "--since",
        type=day_or_age,
        default=(datetime.now(UTC) - timedelta(days=7)).date(),
        metavar="DAY|7d",
        help="the first UTC day, or an age before now (default 7d)",
    )
    usage.add_argument("--until", type=day, metavar="DAY", help="the last UTC day (default today)")
    usage.add_argument("--team", help="admin keys: one team (default: every team)")
    usage.add_argument(
        "--group-by", choices=["job", "day"], default="job", help="a row per job (default) or day"
    )
    usage.add_argument("--by", dest="old_by", choices=["job", "day"], help="deprecated: --group-by")
    example(usage, "opd usage --since 7d --group-by day")
    usage.set_defaults(handler=usage_command)
