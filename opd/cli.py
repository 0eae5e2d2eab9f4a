"""The `opd` command line: the one place that wires the service and the worker.

Worker modules (and so torch) are imported lazily inside the commands that need them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from kernel.spec import SpecError, load_spec
from kernel.summary import summary_lines
from opd.outputs import add_output_commands
from opd.sdk import Client, OPDError
from opd.shading import sample_text
from opd.sweeps import add_sweep_commands

if TYPE_CHECKING:
    from app.core.config import Settings
    from app.jobs.schemas import JobPublic
    from kernel.spec import JobSpec
    from worker.engine.mlflow_mirror import MlflowSink
    from worker.engine.sinks import ConsoleSink


class CommandError(Exception):
    """A failure the user can act on: printed as one line, exit status 1."""


def run_command(args: argparse.Namespace) -> int:
    """Run one job in the foreground, like the reference scripts."""
    from kernel.errors import OPDError
    from worker.engine.checkpoint_log import CheckpointLog, latest_state, sampler_weights
    from worker.engine.loop import RunResult, SavedState, Stop, run_job
    from worker.engine.sinks import ConsoleSink, FanOut, JsonlSink, Sink, SummarySink, SwanLabSink

    spec = load_spec(args.spec)
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
    from worker.engine.mlflow_mirror import MlflowSink

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


def settings() -> Settings:
    from app.core.config import get_settings

    return get_settings()


def logging_setup() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def api_command(args: argparse.Namespace) -> int:
    import gc

    import uvicorn

    from app.main import create_app

    app = create_app()
    # What exists now lives as long as the process: frozen, the collector never scans it
    # again. Its full passes over it paused every request ~100 ms (benchmarks/curve_reads.py).
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning" if args.quiet else "info")
    return 0


def worker_command(args: argparse.Namespace) -> int:
    from worker.service.main import serve_worker

    logging_setup()
    asyncio.run(serve_worker(settings()))
    return 0


def migrate_command(args: argparse.Namespace) -> int:
    from app.core.db import migrate

    url = settings().database_url
    migrate(url)
    print(f"Database is at the latest schema: {url}")
    return 0


def rotate_secrets_command(args: argparse.Namespace) -> int:
    import app.tables  # noqa: F401  (every table in the metadata before a flush)
    from app.core.db import migrate, standalone_session
    from app.core.encryption import SecretUnreadable, secret_box
    from app.webhooks.store import reseal_secrets

    config = settings()
    migrate(config.database_url, settings=config)

    async def reseal() -> int:
        async with standalone_session(config.database_url) as session:
            return await reseal_secrets(session, secret_box(config))

    try:
        count = asyncio.run(reseal())
    except SecretUnreadable as error:
        raise CommandError(f"{error}: add the key it was encrypted under") from None
    print(f"Re-encrypted {count} secret(s) under the first key of OPD_SECRET_KEY")
    return 0


def serve_command(args: argparse.Namespace) -> int:
    from opd.serve import serve

    return serve(settings(), args.host, args.port, args.demo, args.demo_spec)


def duration(text: str) -> timedelta:
    """`90d`, `12h`, `2w` or `30m` as a timedelta (for --expires, --since)."""
    units = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.isdigit() or int(number) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number and a unit, e.g. 90d, 12h, 2w")
    return timedelta(**{units[unit]: int(number)})


def keys_command(args: argparse.Namespace) -> int:
    import app.tables  # noqa: F401  (every table in the metadata before a flush)
    from app.audit.store import record_audit
    from app.auth.keys import create_key, list_keys, revoke_key
    from app.auth.schemas import Scope
    from app.core.db import migrate, standalone_session
    from app.core.tables import utcnow

    url = settings().database_url
    migrate(url)

    async def act() -> int:
        async with standalone_session(url) as session:
            if args.keys_action == "create":
                scope = Scope.admin if args.admin else Scope(args.scope)
                expires = utcnow() + args.expires if args.expires else None
                new = await create_key(
                    session, args.team, scope=scope, expires_at=expires, commit=False
                )
                target = f"key {new.api_key.prefix}"
                detail = {"team": args.team, "scope": scope.value}
                await record_audit(session, None, "key.create", target, 201, detail)
                print(new.key)
                until = f", expires {expires:%Y-%m-%d %H:%M} UTC" if expires else ""
                print(
                    f"Key for team {args.team!r} (scope {scope.value}{until}); "
                    "it is shown only this once.",
                    file=sys.stderr,
                )
            elif args.keys_action == "list":
                now = utcnow()
                for key, team in await list_keys(session):
                    state = "revoked" if key.revoked_at else "active"
                    if key.expires_at is not None and not key.revoked_at:
                        state = "expired" if key.expires_at <= now else "active"
                        state += f" (until {key.expires_at:%Y-%m-%d %H:%M} UTC)"
                    print(f"{key.prefix}  team={team.name}  scope={key.scope}  {state}")
            elif await revoke_key(session, args.prefix, commit=False):
                await record_audit(session, None, "key.revoke", f"key {args.prefix}", 204)
            else:
                raise CommandError(f"no key with prefix {args.prefix!r}")
        return 0

    return asyncio.run(act())


def limit_value(text: str) -> int | None:
    """A limit for `opd teams set`: a positive number, or `default`."""
    if text == "default":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of jobs (1 or more) or default")
    return int(text)


def teams_command(args: argparse.Namespace) -> int:
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
        print(f"{'team':<24} {'running':>8} {'queued':>7}  {'max running':<16} max queued")
        for team in teams:
            print(
                f"{team.name:<24} {team.running:>8} {team.queued:>7}  "
                f"{shown(team.max_running, team.effective_max_running):<16} "
                f"{shown(team.max_queued, team.effective_max_queued)}"
            )
        return 0

    return asyncio.run(act())


def client(args: argparse.Namespace) -> Client:
    return Client(args.url, args.key)


def job_line(job: JobPublic) -> str:
    error = f"  [{job.error.code}] {job.error.message}" if job.error else ""
    trial = f"  sweep {job.sweep_id} trial {job.sweep_trial}" if job.sweep_id else ""
    stopped = f" ({job.stop_reason})" if job.stop_reason else ""
    return (
        f"{job.id:>6}  {job.status:<10} {job.steps_done:>6}/{job.total_steps:<6} "
        f"{job.name}{stopped}{trial}{error}"
    )


def count(text: str) -> int:
    """A --limit: 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number, 1 or more")
    return int(text)


def page_size(limit: int, largest: int) -> int:
    """The page to ask for when `limit` items are shown: as few requests as the API allows."""
    return min(limit, largest)


def submit_command(args: argparse.Namespace) -> int:
    job = client(args).jobs.create(load_spec(args.spec), idempotency_key=args.idempotency_key)
    print(job.id if args.quiet else f"Submitted job {job.id} ({job.status})")
    return 0


def jobs_command(args: argparse.Namespace) -> int:
    jobs = client(args).jobs.list(status=args.status, page_size=page_size(args.limit, 100))
    for job in islice(jobs, args.limit):
        print(job_line(job))
    return 0


def status_command(args: argparse.Namespace) -> int:
    job = client(args).jobs.get(args.job)
    print(job_line(job))
    for line in summary_lines(job.summary):
        print(line)
    for field in ("queue_reason", "last_state_path", "final_weights_path"):
        if value := getattr(job, field):
            print(f"{field}: {value}")
    return 0


def samples_command(args: argparse.Namespace) -> int:
    kept = client(args).jobs.samples(args.job, step=args.step, page_size=page_size(args.limit, 100))
    samples = list(islice(kept, args.limit))
    if not samples:
        print(
            f"job {args.job} kept no rollouts{'' if args.step is None else f' at step {args.step}'}"
        )
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    for sample in samples:
        print(sample_text(sample, color))
    return 0


def watch_command(args: argparse.Namespace) -> int:
    job = client(args).jobs.wait(args.job, progress=True)
    print(job_line(job))
    return 0 if job.status == "succeeded" else 1


def action_command(args: argparse.Namespace) -> int:
    print(job_line(getattr(client(args).jobs, args.action)(args.job)))
    return 0


def usage_command(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    first = (datetime.now(UTC) - args.since).date()
    report = client(args).usage.get(first=first, group_by=args.group_by, team=args.team)
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


def audit_command(args: argparse.Namespace) -> int:
    entries = client(args).audit.list(action=args.action, page_size=page_size(args.limit, 200))
    for entry in islice(entries, args.limit):
        print(
            f"{entry.created_at:%Y-%m-%dT%H:%M:%S}  {entry.key_prefix or 'cli':<10} "
            f"team={entry.team_id}  {entry.action:<16} {entry.target or '':<24} "
            f"{entry.status_code}"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opd", description="On-policy distillation jobs.")
    parser.add_argument("--traceback", action="store_true", help="show full tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run one job spec in the foreground")
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

    serve = commands.add_parser(
        "serve", help="the whole service on one machine: API, a worker, SQLite, its own Redis"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--demo",
        action="store_true",
        help="submit the demo job (the arithmetic student learns from its teacher), show its "
        "progress and held-out accuracy, stop when it ends",
    )
    serve.add_argument(
        "--demo-spec",
        type=Path,
        help="the spec --demo submits (default: examples/arith.yaml)",
    )
    serve.set_defaults(handler=serve_command)

    api = commands.add_parser("api", help="the HTTP API (scale out: run several)")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)
    api.add_argument("--quiet", action="store_true", help="log warnings only")
    api.set_defaults(handler=api_command)

    commands.add_parser(
        "worker", help="a worker that runs queued jobs (needs OPD_REDIS_URL)"
    ).set_defaults(handler=worker_command)
    commands.add_parser("migrate", help="bring the database to the latest schema").set_defaults(
        handler=migrate_command
    )

    commands.add_parser(
        "rotate-secrets",
        help="re-encrypt stored secrets under OPD_SECRET_KEY's first key (then drop old keys)",
    ).set_defaults(handler=rotate_secrets_command)

    keys = commands.add_parser("keys", help="API keys of teams")
    key_actions = keys.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    create = key_actions.add_parser("create", help="make a key (printed once)")
    create.add_argument("--team", required=True)
    create.add_argument(
        "--scope",
        choices=["read", "submit", "admin"],
        default="submit",
        help="read: GET only; submit: also create and act on the team's jobs (default); "
        "admin: every team, keys, teams' limits",
    )
    create.add_argument("--admin", action="store_true", help="the same as --scope admin")
    create.add_argument(
        "--expires", type=duration, metavar="90d", help="the key stops working then"
    )
    key_actions.add_parser("list", help="list keys (prefixes only)")
    revoke = key_actions.add_parser("revoke", help="revoke a key by its prefix")
    revoke.add_argument("prefix")
    keys.set_defaults(handler=keys_command)

    teams = commands.add_parser("teams", help="teams and their limits")
    team_actions = teams.add_subparsers(dest="teams_action", required=True, metavar="ACTION")
    team_actions.add_parser("list", help="every team: jobs running and queued, limits")
    team_set = team_actions.add_parser("set", help="set a team's limits (default: the service's)")
    team_set.add_argument("name")
    for flag in ("--max-running", "--max-queued"):
        team_set.add_argument(flag, type=limit_value, default=..., metavar="N|default")
    teams.set_defaults(handler=teams_command)

    http = argparse.ArgumentParser(add_help=False)
    http.add_argument("--url", help="API address (default $OPD_URL or http://127.0.0.1:8000)")
    http.add_argument("--key", help="API key (default $OPD_API_KEY or opd serve's local key)")

    submit = commands.add_parser("submit", parents=[http], help="submit a job spec to the API")
    submit.add_argument("spec")
    submit.add_argument("--idempotency-key", help="resubmitting with the same key is safe")
    submit.add_argument("--quiet", action="store_true", help="print the job id only")
    submit.set_defaults(handler=submit_command)

    jobs = commands.add_parser("jobs", parents=[http], help="list jobs, newest first")
    jobs.add_argument("--status")
    jobs.add_argument("--limit", type=count, default=20)
    jobs.set_defaults(handler=jobs_command)

    samples = commands.add_parser(
        "samples", parents=[http], help="rollouts a job kept, tokens shaded by reverse KL"
    )
    samples.add_argument("job", type=int)
    samples.add_argument("--step", type=int, help="only this step's rollouts")
    samples.add_argument("--limit", type=count, default=4, help="how many (default 4)")
    samples.set_defaults(handler=samples_command)
    add_output_commands(commands, http)
    add_sweep_commands(commands, http)

    usage = commands.add_parser("usage", parents=[http], help="tokens used, per job or per day")
    usage.add_argument("--since", type=duration, default=timedelta(days=7), metavar="7d")
    usage.add_argument("--team", help="admin keys: one team (default: every team)")
    usage.add_argument("--by", dest="group_by", choices=["job", "day"], default="job")
    usage.set_defaults(handler=usage_command)

    audit = commands.add_parser(
        "audit", parents=[http], help="state-changing requests, newest first"
    )
    audit.add_argument("--limit", type=count, default=50)
    audit.add_argument("--action", help="only this action, e.g. job.cancel")
    audit.set_defaults(handler=audit_command)

    for name, handler, text in (
        ("status", status_command, "a job's status and reverse KL"),
        ("watch", watch_command, "a live progress bar with the reverse KL until the job ends"),
        ("cancel", action_command, "cancel a job (a running one stops at a step boundary)"),
        ("pause", action_command, "pause a job, keeping its state"),
        ("resume", action_command, "resume a paused job"),
    ):
        command = commands.add_parser(name, parents=[http], help=text)
        command.add_argument("job", type=int)
        command.set_defaults(handler=handler, action=name)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (SpecError, CommandError, OPDError) as error:
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
