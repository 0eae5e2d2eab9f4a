"""`opd webhooks create URL --event E ... | list | delete ID | deliveries ID | resend ID
DELIVERY`: a team's webhooks through the SDK, as `/v1/webhooks` has them."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from app.webhooks.schemas import WebhookEvent
from opd.cli.common import api_options, client, example, one_line

if TYPE_CHECKING:
    from opd.cli.common import Commands


def webhooks_command(args: argparse.Namespace) -> int:
    hooks = client(args).webhooks
    if args.webhook_action == "create":
        made = hooks.create(args.hook_url, args.event, description=args.description)
        print(f"Created webhook {made.id} for {', '.join(made.events)} -> {made.url}")
        print(f"signing secret (shown only now): {made.secret}")
    elif args.webhook_action == "list":
        shown = list(hooks.list())
        print("no webhooks" if not shown else f"{'id':>6}  url  events")
        for hook in shown:
            print(f"{hook.id:>6}  {hook.url}  {', '.join(hook.events)}")
    elif args.webhook_action == "delete":
        hooks.delete(args.webhook)
        print(f"Deleted webhook {args.webhook}")
    elif args.webhook_action == "deliveries":
        sent = list(hooks.deliveries(args.webhook))
        print("no deliveries" if not sent else f"{'id':>6}  {'event':<20} {'status':<10} attempts")
        for delivery in sent:
            error = f"  {one_line(delivery.last_error)}" if delivery.last_error else ""
            print(
                f"{delivery.id:>6}  {delivery.event:<20} {delivery.status:<10} "
                f"{delivery.attempts}{error}"
            )
    else:
        again = hooks.resend(args.webhook, args.delivery)
        print(f"Queued delivery {again.id} again ({again.status})", file=sys.stderr)
    return 0


def add_parsers(commands: Commands) -> None:
    http = api_options()
    webhooks = commands.add_parser("webhooks", help="the team's webhooks and their deliveries")
    actions = webhooks.add_subparsers(dest="webhook_action", required=True, metavar="ACTION")
    create = actions.add_parser("create", parents=[http], help="subscribe a URL to events")
    create.add_argument(  # not `url`, which is the API's address (--url)
        "hook_url", metavar="URL", help="where the events are POSTed (an http or https URL)"
    )
    create.add_argument(
        "--event",
        action="append",
        required=True,
        choices=[event.value for event in WebhookEvent],
        help="an event to send (repeatable)",
    )
    create.add_argument("--description", help="a note for people")
    example(create, "opd webhooks create https://hooks.example.com/opd --event job.succeeded")
    example(
        actions.add_parser("list", parents=[http], help="the team's webhooks"), "opd webhooks list"
    )
    for name, text in (
        ("delete", "unsubscribe a webhook"),
        ("deliveries", "what was sent to a webhook, newest first"),
    ):
        action = actions.add_parser(name, parents=[http], help=text)
        action.add_argument("webhook", type=int, help="the webhook's id")
        example(action, f"opd webhooks {name} 1")
    resend = actions.add_parser("resend", parents=[http], help="send a delivery again")
    resend.add_argument("webhook", type=int, help="the webhook's id")
    resend.add_argument("delivery", type=int, help="the delivery's id, as deliveries lists it")
    example(resend, "opd webhooks resend 1 1")
    webhooks.set_defaults(handler=webhooks_command)
