"""The `opd` command line: the one place that wires the service and the worker.

Each command module adds its commands (`add_parsers`); this module assembles them and turns
what a command raises into one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Callable

from kernel.spec import SpecError
from opd.cli import (
    audit,
    feedback,
    files,
    jobs,
    keys,
    outputs,
    run,
    service,
    sweeps,
    teams,
    usage,
    vllm,
    webhooks,
)
from opd.cli.common import CommandError, deprecation_note, key_hint
from opd.sdk import AuthenticationError, OPDError

COMMAND_GROUPS = (
    run.add_parsers,
    service.add_parsers,
    keys.add_parsers,
    teams.add_parsers,
    jobs.add_parsers,
    outputs.add_parsers,
    sweeps.add_parsers,
    files.add_parsers,
    usage.add_parsers,
    audit.add_parsers,
    webhooks.add_parsers,
    feedback.add_parsers,
    vllm.add_parsers,
    jobs.add_action_parsers,
)
"""In the order `opd --help` lists the commands."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opd", description="On-policy distillation jobs.")
    parser.add_argument("--traceback", action="store_true", help="show full tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parsers in COMMAND_GROUPS:
        add_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    if renamed := getattr(args, "renamed", None):
        deprecation_note(*renamed)
    try:
        status = handler(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the exit
        return status
    except BrokenPipeError:
        # The reader went away (`opd jobs | head -4`): stop quietly, as a command killed by
        # SIGPIPE does; stdout goes to /dev/null so the exit's flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return SIGPIPE_STATUS
    except AuthenticationError as error:
        message = f"{error}\n{key_hint(args)}"
    except (SpecError, CommandError, OPDError) as error:
        message = str(error)
    except KeyboardInterrupt:
        message = "interrupted"
    except ModuleNotFoundError as error:
        if args.traceback:
            traceback.print_exc()
        message = missing_extra(error)
    except Exception as error:  # a one-line error for the user; --traceback for developers
        if args.traceback:
            traceback.print_exc()
        message = f"{type(error).__name__}: {error}"
    print(f"error: {message}", file=sys.stderr)
    return 1


SIGPIPE_STATUS = 128 + signal.SIGPIPE
"""The status a shell gives a command a closed pipe ended."""

EXTRAS = {"torch": "local", "transformers": "local", "peft": "local", "tinker": "tinker"}
"""The extra that brings a module's package, where it is not `server`."""


def missing_extra(error: ModuleNotFoundError) -> str:
    """What to install for a command whose package is missing: `pip install opd-service`
    gives the SDK and the client commands; the service, the worker and `opd run` need the
    `server` extra (the local engine `local`)."""
    package = (error.name or "").split(".")[0]
    extra = EXTRAS.get(package, "server")
    return (
        f"this command needs the {package!r} package, which the {extra!r} extra installs: "
        f"pip install 'opd-service[{extra}]'"
    )
