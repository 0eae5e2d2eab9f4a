"""The `opd` command line: the one place that wires the service and the worker.

Worker modules (and so torch) are imported lazily inside the commands that need them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from app.spec import SpecError, load_spec


class CommandError(Exception):
    """A failure the user can act on: printed as one line, exit status 1."""


def run_command(args: argparse.Namespace) -> int:
    """Run one job in the foreground, like the reference scripts."""
    from worker.engine.errors import OPDError
    from worker.engine.loop import run_job
    from worker.engine.sinks import ConsoleSink, FanOut, JsonlSink, Sink, SwanLabSink

    spec = load_spec(args.spec)
    artifacts = Path(args.artifacts or Path("runs") / spec.name).resolve()
    sinks: list[Sink] = [ConsoleSink()]
    if args.metrics_out:
        sinks.append(JsonlSink(args.metrics_out))
    if spec.swanlab.enabled:
        sinks.append(SwanLabSink(artifacts / "swanlog"))

    stop_requested = False

    def request_stop() -> None:
        nonlocal stop_requested
        if stop_requested:
            raise KeyboardInterrupt
        stop_requested = True
        print(
            "\nStopping at the next step boundary and saving state "
            "(Ctrl-C again to abort without saving)",
            file=sys.stderr,
        )

    async def main() -> object:
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, request_stop)
        return await run_job(
            spec,
            FanOut(*sinks),
            artifact_dir=artifacts,
            data_root=Path(args.data_root),
            resume_from=args.resume_from,
            should_stop=lambda: stop_requested,
        )

    try:
        result = asyncio.run(main())
    except OPDError as error:
        raise CommandError(f"[{error.code}] {error}") from error
    if result.stopped:
        print(
            f"Stopped after {result.steps_done} steps. Resume with:\n"
            f"  opd run {args.spec} --resume-from {result.state_path}"
        )
    else:
        print(f"Saved weights: {result.final_weights_path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opd", description="On-policy distillation jobs.")
    parser.add_argument("--traceback", action="store_true", help="show full tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run one job spec in the foreground")
    run.add_argument("spec", help="job spec file (YAML or JSON)")
    run.add_argument("--metrics-out", metavar="FILE.jsonl", help="append one JSON line per step")
    run.add_argument("--resume-from", metavar="STATE_PATH", help="a saved training state")
    run.add_argument("--artifacts", metavar="DIR", help="where weights go (default runs/NAME)")
    run.add_argument(
        "--data-root",
        metavar="DIR",
        default=os.environ.get("OPD_DATA_ROOT", "."),
        help="base for relative dataset paths and the DeepMath cache",
    )
    run.set_defaults(handler=run_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (SpecError, CommandError) as error:
        message = str(error)
    except KeyboardInterrupt:
        message = "interrupted"
    except Exception as error:  # a one-line error for the user; --traceback for developers
        if args.traceback:
            traceback.print_exc()
        message = f"{type(error).__name__}: {error}"
    print(f"error: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
