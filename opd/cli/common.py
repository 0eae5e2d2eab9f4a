"""What the `opd` commands share: the error a user can act on, the service's settings, the
API client from `--url` / `--key`, and the argument types several commands take."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx

from opd.sdk import Client, PermissionDenied

if TYPE_CHECKING:
    from app.core.config import Settings

    Commands = argparse._SubParsersAction[argparse.ArgumentParser]
    """`opd COMMAND`: each command module adds its commands to it (`add_parsers`)."""


class CommandError(Exception):
    """A failure the user can act on: printed as one line, exit status 1."""


def settings() -> Settings:
    """The service's settings, for the commands that run or change the service."""
    from app.core.config import get_settings  # start-up time: the API commands need none

    return get_settings()


def api_options() -> argparse.ArgumentParser:
    """The parent parser of the commands that talk to the API."""
    http = argparse.ArgumentParser(add_help=False)
    http.add_argument("--url", help="API address (default $OPD_URL or http://127.0.0.1:8000)")
    http.add_argument("--key", help="API key (default $OPD_API_KEY or opd serve's local key)")
    return http


def client(args: argparse.Namespace) -> Client:
    return Client(args.url, args.key)


ADMIN_HELP = (
    "Over HTTP with an admin key when --url/--key (or OPD_URL/OPD_API_KEY) is given, or "
    "when `opd serve`'s service runs here (its local key); else straight in the service's "
    "database (OPD_HOME, OPD_DATABASE_URL), which makes a new service's first key."
)
"""How every admin command (`opd keys`, `opd teams`) reaches the service."""


PROBE_SECONDS = 2.0
"""How long an admin command waits for `opd serve`'s service to answer before it writes
straight in the database instead."""


def admin_api(args: argparse.Namespace) -> Client | None:
    """The service's API, when an admin command (`opd keys`, `opd teams`) goes over HTTP:
    an address or a key was given (--url, --key, OPD_URL, OPD_API_KEY: an admin key is
    needed), or `opd serve` wrote its local admin key here and its service answers. None:
    the command writes straight in the service's database (the first key of a new
    service, a service that is not running), which needs the `server` extra."""
    if args.url or args.key or os.environ.get("OPD_URL") or os.environ.get("OPD_API_KEY"):
        return client(args)
    from opd.sdk.client import local_key_path  # start-up time: only for admin commands

    try:
        local = local_key_path(settings().home)
    except ModuleNotFoundError:  # the bare install: no service of its own here
        return None
    if not local.is_file():
        return None
    api = client(args)
    try:
        api.http.get("/healthz", timeout=PROBE_SECONDS).raise_for_status()
    except httpx.HTTPError:
        api.close()
        return None
    return api


def in_database(what: str) -> None:
    """Before an admin command writes straight in the database: CommandError (one line
    that says both ways) where the database layer is not installed."""
    try:
        import sqlalchemy  # noqa: F401
    except ModuleNotFoundError:
        raise CommandError(
            f"{what} goes to the service over HTTP with an admin key: give --url URL and "
            "--key KEY (or set OPD_URL and OPD_API_KEY). Straight in the service's database "
            "(on its machine) it needs the server extra: pip install 'opd-service[server]'"
        ) from None


def key_hint(args: argparse.Namespace) -> str:
    """How to give the API a key, after it refused the one sent (or none): which source
    this command's key came from, and where the local key is looked up."""
    from opd.sdk.client import local_key_path  # start-up time: only after a 401

    local = local_key_path(settings().home)
    if getattr(args, "key", None):
        used = "the key given with --key was refused"
    elif os.environ.get("OPD_API_KEY"):
        used = "the key in OPD_API_KEY was refused"
    elif local.is_file():
        used = f"the key in {local} (written by `opd serve`) was refused"
    else:
        used = f"no key was given, and there is none at {local} (where `opd serve` writes one)"
    return (
        f"{used}. Give a key with --key KEY or `export OPD_API_KEY=KEY` (an admin makes one "
        "with `opd keys create --team NAME`); without either, opd reads "
        f"{local} (OPD_HOME/api-key, OPD_HOME defaults to ./.opd)"
    )


def example(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The command's example, run as written: `opd COMMAND --help` ends with it, the
    reference page shows it, and tests/e2e/test_newcomer.py runs every one against a
    service from the bare install (ids as a new service gives them; an UPPER word stands
    for what the user has, such as a key's PREFIX)."""
    parser.epilog = f"example: {command}"
    return parser


def renamed(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Make `parser` (a command's old name, kept for one release) say, when used, that
    `new` replaces it (`main` prints the note)."""
    parser.set_defaults(renamed=(old, new))


def deprecation_note(old: str, new: str) -> None:
    """On stderr, so that what the command prints on stdout stays as scripts read it."""
    print(f"note: {old} is deprecated and goes in the next release; use {new}", file=sys.stderr)


def one_line(text: str, width: int = 80) -> str:
    """A message as a table cell: its first line, cut to `width` characters."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    cut = first if len(first) <= width else first[: width - 1] + "…"
    return cut + (" …" if cut == first and "\n" in text.strip() else "")


def team_names(api: Client) -> dict[int, str] | None:
    """Team names by id when the key may read every team's (an admin key), else None."""
    try:
        return {team.id: team.name for team in api.teams.list()}
    except PermissionDenied:
        return None


def duration(text: str) -> timedelta:
    """`90d`, `12h`, `2w` or `30m` as a timedelta (for --expires, --since)."""
    units = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.isdigit() or int(number) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number and a unit, e.g. 90d, 12h, 2w")
    return timedelta(**{units[unit]: int(number)})


def count(text: str) -> int:
    """A --limit: 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number, 1 or more")
    return int(text)


def label(text: str) -> tuple[str, str]:
    """A --metadata KEY=VALUE (a stored completion's label)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, e.g. topic=arithmetic")
    return key, value


def page_size(limit: int, largest: int) -> int:
    """The page to ask for when `limit` items are shown: as few requests as the API allows."""
    return min(limit, largest)
