"""`opd run SPEC`: one job in the foreground with the engine alone (no API, no queue).

The engine (and so torch) is imported inside the functions that use it, to keep the other
commands' start-up fast.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kernel.errors import OPDError
from kernel.spec import load_spec
from kernel.summary import summary_lines
from opd.cli.common import CommandError, example, settings

if TYPE_CHECKING:
    from kernel.spec import JobSpec
    from opd.cli.common import Commands
    from worker.engine.tracking.mlflow_mirror import MlflowSink
    from worker.engine.tracking.sinks import ConsoleSink


def run_command(args: argparse.Namespace) -> int:
    """Run one job in the foreground, like the reference scripts."""
    # start-up time: the engine loads torch
    from worker.engine.loop.checkpoint_log import CheckpointLog, latest_state, sampler_weights
    from worker.engine.loop.job import run_job
    from worker.engine.loop.state import RunResult, SavedState, Stop
    from worker.engine.tracking.sinks import (
        ConsoleSink,
        FanOut,
        JsonlSink,
        Sink,
        SummarySink,
        SwanLabSink,
    )

    spec = load_spec(args.spec)
    if unfilled := [at for at, dataset in spec.stored_datasets() if dataset.rows is None]:
        raise CommandError(
            f"{unfilled[0]}.source: stored_completions reads the team's stored completions, "
            "which the service fills in when the job is submitted, and opd run has no "
            "service: submit the spec to one (opd jobs create SPEC)"
        )
    artifacts = Path(args.artifacts or Path("runs") / spec.name).resolve()
    resume = None
    if args.resume_from is not None:
        if args.resume_step is None:
            raise CommandError("--resume-from needs --resume-step (the steps the state had taken)")
        resume = SavedState(args.resume_from, args.resume_step, sampler_weights(artifacts))
    elif args.resume:
        resume = latest_state(artifacts)
        if resume is None:
            raise CommandError(f"no saved state recorded in {artifacts}: nothing to resume")
    summary = SummarySink()
    console = ConsoleSink()
    sinks: list[Sink] = [console, CheckpointLog(artifacts), summary]
    if args.metrics_out:
        sinks.append(JsonlSink(args.metrics_out))
    if spec.swanlab.enabled:
        sinks.append(SwanLabSink(artifacts / "swanlog"))
    mirror = mlflow_sink(spec, artifacts, resume is not None, console)
    if mirror is not None:
        sinks.append(mirror)

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

    async def main() -> RunResult:
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, request_stop)
        outcome = "interrupted"
        try:
            result = await run_job(
                spec,
                FanOut(*sinks),
                artifact_dir=artifacts,
                data_root=Path(args.data_root),
                resume=resume,
                should_stop=lambda: Stop.resume if stop_requested else None,
                vllm_servers=settings().vllm_tiers() if spec.sampling.engine == "vllm" else None,
            )
            outcome = "stopped" if result.stopped else "succeeded"
            return result
        except Exception:
            outcome = "failed"
            raise
        finally:
            if mirror is not None:
                await end_mirror(mirror, outcome)

    try:
        result = asyncio.run(main())
    except OPDError as error:
        raise CommandError(f"[{error.code}] {error}") from error
    for line in summary_lines(summary.summary()):
        print(line)
    if result.stopped:
        print(
            f"Stopped after {result.steps_done} steps. Resume with:\n"
            f"  opd run {args.spec} --resume"
            + (f" --artifacts {args.artifacts}" if args.artifacts else "")
        )
    else:
        print(f"Saved weights: {result.final_weights_path}")
    return 0


MLFLOW_RUN_FILE = "mlflow_run_id"
MIRROR_GRACE_SECONDS = 30.0


def mlflow_sink(
    spec: JobSpec, artifacts: Path, resuming: bool, console: ConsoleSink
) -> MlflowSink | None:
    """The run's MLflow mirror; a resumed run goes on with the MLflow run its artifacts
    folder names (`mlflow_run_id`)."""
    from worker.engine.tracking.mlflow_mirror import MlflowSink  # start-up time: the engine

    if spec.trackers.mlflow is None:
        return None
    kept = artifacts / MLFLOW_RUN_FILE
    return MlflowSink(
        spec.trackers.mlflow,
        run_id=kept.read_text().strip() if resuming and kept.is_file() else None,
        notify=console.event,
        on_run=kept.write_text,
    )


async def end_mirror(mirror: MlflowSink, outcome: str) -> None:
    """Give the mirror a while to send what it holds; the command does not wait longer."""
    mirror.finish(outcome)
    if not await mirror.flushed(MIRROR_GRACE_SECONDS):
        print(
            f"MLflow: {mirror.pending()} steps were not sent to {mirror.spec.tracking_uri}",
            file=sys.stderr,
        )


def add_parsers(commands: Commands) -> None:
    run = commands.add_parser("run", help="run one job spec in the foreground")
    example(run, "opd run examples/tiny.yaml --metrics-out metrics.jsonl")
    run.add_argument("spec", help="job spec file (YAML or JSON)")
    run.add_argument("--metrics-out", metavar="FILE.jsonl", help="append one JSON line per step")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last state recorded in <artifacts>/checkpoints.jsonl",
    )
    run.add_argument("--resume-from", metavar="STATE_PATH", help="a saved training state ...")
    run.add_argument("--resume-step", type=int, metavar="N", help="... and the steps it had taken")
    run.add_argument("--artifacts", metavar="DIR", help="where weights go (default runs/NAME)")
    run.add_argument(
        "--data-root",
        metavar="DIR",
        default=os.environ.get("OPD_DATA_ROOT", "."),
        help="base for relative dataset paths and the DeepMath cache",
    )
    run.set_defaults(handler=run_command)
