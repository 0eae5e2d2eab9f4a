"""`opd audit`: the state-changing requests, newest first."""

from __future__ import annotations

import argparse
from itertools import islice
from typing import TYPE_CHECKING

from opd.cli.common import api_options, client, count, page_size

if TYPE_CHECKING:
    from opd.cli.common import Commands


def audit_command(args: argparse.Namespace) -> int:
    entries = client(args).audit.list(action=args.action, page_size=page_size(args.limit, 200))
    for entry in islice(entries, args.limit):
        print(
            f"{entry.created_at:%Y-%m-%dT%H:%M:%S}  {entry.key_prefix or 'cli':<10} "
            f"team={entry.team_id}  {entry.action:<16} {entry.target or '':<24} "
            f"{entry.status_code}"
        )
    return 0


def add_parsers(commands: Commands) -> None:
    http = api_options()
    audit = commands.add_parser(
        "audit", parents=[http], help="state-changing requests, newest first"
    )
    audit.add_argument("--limit", type=count, default=50)
    audit.add_argument("--action", help="only this action, e.g. job.cancel")
    audit.set_defaults(handler=audit_command)
