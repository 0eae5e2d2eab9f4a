"""`opd audit`: the state-changing requests, newest first."""

from __future__ import annotations

import argparse
from itertools import islice
from typing import TYPE_CHECKING

from opd.cli.common import api_options, client, count, example, page_size

if TYPE_CHECKING:
    from opd.cli.common import Commands


def audit_command(args: argparse.Namespace) -> int:
    entries = client(args).audit.list(action=args.action, page_size=page_size(args.limit, 200))
    shown = list(islice(entries, args.limit))
    if not shown:
        print("no audit entries" + (f" for {args.action}" if args.action else ""))
        return 0
    print(f"{'time':<19}  {'key':<10} {'team':<16} {'action':<16} {'target':<24} status")
    for entry in shown:
        team = entry.team or ("-" if entry.team_id is None else str(entry.team_id))
        print(
            f"{entry.created_at:%Y-%m-%dT%H:%M:%S}  {entry.key_prefix or 'cli':<10} "
            f"{team:<16} {entry.action:<16} {entry.target or '':<24} {entry.status_code}"
        )
    return 0


def add_parsers(commands: Commands) -> None:
    http = api_options()
    audit = commands.add_parser(
        "audit", parents=[http], help="state-changing requests, newest first"
    )
    audit.add_argument("--limit", type=count, default=50, help="how many (default 50)")
    audit.add_argument(
        "--action", help="only this action, e.g. job.cancel (an unknown one lists them all)"
    )
    example(audit, "opd audit --limit 5 --action job.create")
    audit.set_defaults(handler=audit_command)
