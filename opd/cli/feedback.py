"""`opd feedback list | show COMPLETION | give COMPLETION | rm COMPLETION`: the team's
stored completions (what the completions doors kept with `store: true`) and the feedback it
gives on them, through the SDK. A job distils from them with
`dataset.source: stored_completions`."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from itertools import islice
from typing import TYPE_CHECKING

from app.stored_completions.schemas import StoredCompletionRead
from opd.cli.common import (
    CommandError,
    api_options,
    client,
    count,
    example,
    label,
    one_line,
    page_size,
)

if TYPE_CHECKING:
    from opd.cli.common import Commands

MAX_PAGE = 100
"""The list door's largest page."""


def ratings(completion: StoredCompletionRead) -> str:
    given = [f"{f.rating:+d}" for f in completion.feedback if f.rating is not None]
    corrected = sum(f.correction is not None for f in completion.feedback)
    return f"rated {','.join(given) or '-'} corrected {corrected}"


def completion_line(completion: StoredCompletionRead) -> str:
    when = datetime.fromtimestamp(completion.created, UTC).strftime("%Y-%m-%d %H:%M")
    return (
        f"{completion.id}  {completion.model}  {when}  {ratings(completion)}  "
        f"{one_line(completion.answer(), 50)!r}"
    )


def feedback_command(args: argparse.Namespace) -> int:
    stored = client(args).stored_completions
    if args.feedback_action == "list":
        found = stored.list(
            model=args.model,
            metadata=dict(args.metadata or []),
            rating=args.rating,
            has_feedback=args.has_feedback,
            newest_first=True,
            page_size=page_size(args.limit, MAX_PAGE),
        )
        shown = list(islice(found, args.limit))
        print("\n".join(map(completion_line, shown)) if shown else "no stored completions")
    elif args.feedback_action == "show":
        completion = stored.get(args.completion)
        labels = ", ".join(f"{key}={value}" for key, value in completion.metadata.items())
        print(completion_line(completion))
        print(f"metadata: {labels or '-'}")
        for message in stored.messages(args.completion):
            print(f"{message.role}: {message.content or ''}")
        print(f"answer: {completion.answer()}")
        for given in completion.feedback:
            rating = "-" if given.rating is None else f"{given.rating:+d}"
            author = given.author or "-"
            print(f"{given.id}  rating {rating}  by {author}: {given.correction or ''}")
    elif args.feedback_action == "give":
        if args.rating is None and args.correction is None:
            raise CommandError("give --rating, --correction or both")
        given = stored.feedback(
            args.completion, rating=args.rating, correction=args.correction, author=args.author
        )
        print(f"Gave {given.id} on {given.completion_id}")
    elif args.feedback_action == "rm":
        stored.delete(args.completion)
        print(f"Deleted {args.completion} and its feedback")
    return 0


def add_parsers(commands: Commands) -> None:
    http = api_options()
    feedback = commands.add_parser(
        "feedback", help="stored completions (served with store: true) and feedback on them"
    )
    actions = feedback.add_subparsers(dest="feedback_action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", parents=[http], help="the team's stored completions, newest first"
    )
    listing.add_argument("--model", help="only those of this model (job-N, an alias)")
    listing.add_argument(
        "--metadata",
        type=label,
        action="append",
        metavar="KEY=VALUE",
        help="only those whose metadata holds it (repeatable: each must hold)",
    )
    listing.add_argument(
        "--rating", type=int, choices=[-1, 0, 1], help="only those some feedback rated so"
    )
    listing.add_argument(
        "--has-feedback",
        action=argparse.BooleanOptionalAction,
        help="only those with feedback (--no-has-feedback: only those without)",
    )
    listing.add_argument("--limit", type=count, default=20, help="how many (default 20)")
    example(listing, "opd feedback list --metadata topic=arithmetic")
    show = actions.add_parser(
        "show", parents=[http], help="a stored completion: its conversation, answer and feedback"
    )
    show.add_argument("completion", help="its id, chatcmpl-... (as list shows it)")
    example(show, "opd feedback show COMPLETION")
    give = actions.add_parser(
        "give", parents=[http], help="rate a stored completion, correct it, or both"
    )
    give.add_argument("completion", help="its id, chatcmpl-... (as list shows it)")
    give.add_argument(
        "--rating", type=int, choices=[-1, 0, 1], help="-1 (bad), 0 (neutral) or 1 (good)"
    )
    give.add_argument(
        "--correction",
        help="the answer it should have given, or a note on what was wrong (what a "
        "teacher.self with context: feedback reads)",
    )
    give.add_argument("--author", help="who gives it")
    example(
        give,
        'opd feedback give COMPLETION --rating -1 --correction "Answer with the number only"',
    )
    remove = actions.add_parser(
        "rm", parents=[http], help="delete a stored completion and its feedback"
    )
    remove.add_argument("completion", help="its id, chatcmpl-... (as list shows it)")
    example(remove, "opd feedback rm COMPLETION")
    feedback.set_defaults(handler=feedback_command)
