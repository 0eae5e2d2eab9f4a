"""The commands on the API's jobs: `opd jobs` (`list`, the default, and `create`; `opd
submit` is the old name of `opd jobs create`), `opd samples` (the rollouts a job kept),
`opd events`, `opd checkpoints` and `opd metrics` (what a job recorded), and, on one job,
`status`, `watch`, `cancel`, `pause` and `resume`."""

from __future__ import annotations

import argparse
import json
import sys
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from kernel.progress import duration
from kernel.spec import load_spec
from kernel.spec.documents import differing_fields
from kernel.summary import Change, summary_lines
from opd.cli.common import (
    CommandError,
    api_options,
    client,
    count,
    example,
    one_line,
    page_size,
    renamed,
    team_names,
)
from opd.cli.shading import sample_text, wants_color

if TYPE_CHECKING:
    from app.budgets.schemas import Estimate
    from app.jobs.schemas import JobPublic
    from opd.cli.common import Commands

JOB_HEADER = (
    f"{'id':>6}  {'status':<10} {'steps':>13} {'created (UTC)':<16}  {'last eval':<15} name"
)


def job_line(job: JobPublic, teams: dict[int, str] | None = None) -> str:
    """One job as a row of `JOB_HEADER` (with a team column first when `teams` is given)."""
    error = f"  [{job.error.code}] {one_line(job.error.message)}" if job.error else ""
    trial = f"  sweep {job.sweep_id} trial {job.sweep_trial}" if job.sweep_id else ""
    stopped = f" ({job.stop_reason})" if job.stop_reason else ""
    team = "" if teams is None else f"{teams.get(job.team_id, str(job.team_id)):<16} "
    return (
        f"{team}{job.id:>6}  {job.status:<10} {job.steps_done:>6}/{job.total_steps:<6} "
        f"{job.created_at:%Y-%m-%d %H:%M}  {last_eval(job):<15} {job.name}{stopped}{trial}{error}"
    )


def last_eval(job: JobPublic) -> str:
    """The held-out figure a job's last eval recorded: its accuracy, else its reverse KL."""
    summary = job.summary
    accuracy = summary.eval_accuracy.last if summary and summary.eval_accuracy else None
    if accuracy is not None:
        return f"accuracy {accuracy:.0%}"
    kl = summary.eval_reverse_kl.last if summary and summary.eval_reverse_kl else None
    return "-" if kl is None else f"reverse KL {kl:.3f}"


def job_header(teams: dict[int, str] | None = None) -> str:
    return ("" if teams is None else f"{'team':<16} ") + JOB_HEADER


def estimate_lines(estimate: Estimate) -> list[str]:
    """The estimate as a table, its basis and how it fits the team's budget."""
    lines = [f"{'tokens':<10} {'low':>14} {'point':>14} {'high':>14}"]
    for name in ("sampled", "teacher", "trained", "eval", "total"):
        span = getattr(estimate, f"{name}_tokens")
        lines.append(f"{name:<10} {span.low:>14,} {span.point:>14,} {span.high:>14,}")
    cost = estimate.cost
    lines.append(
        f"{'cost':<10} {cost.low:>14,.4f} {cost.point:>14,.4f} {cost.high:>14,.4f}"
        if cost
        else f"{'cost':<10} {'unknown (a price is missing)':>44}"
    )
    lines += [f"  - {line}" for line in estimate.basis]
    if fit := estimate.budget:
        left = f"{fit.left:,.0f} tokens" if fit.unit == "tokens" else f"{fit.left:,.2f}"
        lines.append(f"The team has {left} left of its budget this period.")
    return lines


def confirmed(estimate: Estimate, yes: bool) -> bool:
    """Whether to submit a job whose estimate passes what is left of the team's budget:
    `--yes`, or a person answering yes (without a terminal to ask: no)."""
    fit = estimate.budget
    if fit is None or not fit.point_exceeds or yes:
        return True
    question = "The estimate passes what is left of the team's budget: the job would pause "
    question += "when it runs out. Create it anyway? [y/N] "
    if not sys.stdin.isatty():
        print(question + "no (not a terminal: pass --yes to create it)", file=sys.stderr)
        return False
    return input(question).strip().lower() in ("y", "yes")


def create_command(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    api = client(args)
    if args.estimate:
        estimate = api.jobs.estimate(spec)
        print("\n".join(estimate_lines(estimate)))
        if not confirmed(estimate, args.yes):
            print("Not created.", file=sys.stderr)
            return 1
    job = api.jobs.create(spec, idempotency_key=args.idempotency_key)
    if args.quiet:
        print(job.id)
    elif job.existed:
        print(
            f"Job {job.id} already exists ({job.status}): idempotency key "
            f"{args.idempotency_key!r} made it before; nothing new was submitted"
        )
    else:
        print(f"Created job {job.id} ({job.status})")
    return 0


def list_command(args: argparse.Namespace) -> int:
    api = client(args)
    labels = dict(args.metadata)
    jobs = api.jobs.list(
        status=args.status,
        name=args.name,
        sweep=args.sweep,
        metadata=labels or None,
        page_size=page_size(args.limit, 100),
    )
    shown = list(islice(jobs, args.limit))
    if not shown:
        filtered = args.status or args.name or args.sweep or labels
        print("no jobs match these filters" if filtered else "no jobs")
        return 0
    teams = team_names(api)
    print(job_header(teams))
    for job in shown:
        print(job_line(job, teams))
    return 0


def status_command(args: argparse.Namespace) -> int:
    job = client(args).jobs.get(args.job)
    print(job_header())
    print(job_line(job))
    if job.error:
        print(f"error [{job.error.code}]: {job.error.message}")
    for line in summary_lines(job.summary):
        print(line)
    if job.queue_reason:
        print(f"waiting: {job.queue_reason}")
    if job.progress:
        left = duration(job.progress.eta_seconds)
        print(f"now: {job.progress.line()}" + (f", about {left} left" if left else ""))
    if job.final_weights_path:
        print(f"weights: {weights_hint(job)}")
    return 0


def weights_hint(job: JobPublic) -> str:
    """How to get a job's final weights from wherever the command runs (a server's path
    means nothing on the user's machine); Tinker's stay on Tinker, under their URI."""
    if job.spec.backend == "tinker":
        return f"on Tinker at {job.final_weights_path} (fetch them with Tinker's tools)"
    return (
        f"`opd export {job.id} job-{job.id}-final` downloads them into that folder "
        "(--merge: a Hugging Face model)"
    )


def samples_command(args: argparse.Namespace) -> int:
    kept = client(args).jobs.samples(args.job, step=args.step, page_size=page_size(args.limit, 100))
    samples = list(islice(kept, args.limit))
    if not samples:
        print(
            f"job {args.job} kept no rollouts{'' if args.step is None else f' at step {args.step}'}"
        )
    color = wants_color()
    for sample in samples:
        print(sample_text(sample, color))
    return 0


def events_command(args: argparse.Namespace) -> int:
    events = client(args).jobs.events(args.job, page_size=page_size(args.limit, 100))
    shown = list(islice(events, args.limit))
    if not shown:
        print(f"job {args.job} has no events")
        return 0
    print(f"{'time':<19}  {'level':<7} message")
    for event in shown:
        print(
            f"{event.created_at:%Y-%m-%dT%H:%M:%S}  {event.level:<7} {one_line(event.message, 120)}"
        )
    return 0


def checkpoints_command(args: argparse.Namespace) -> int:
    saved = client(args).jobs.checkpoints(args.job, kind=args.kind, page_size=100)
    shown = list(saved)
    if not shown:
        print(
            f"job {args.job} has saved no checkpoints"
            + (f" of kind {args.kind}" if args.kind else "")
        )
        return 0
    print(f"{'id':>6}  {'step':>6}  {'kind':<8} saved")
    for checkpoint in shown:
        print(
            f"{checkpoint.id:>6}  {checkpoint.step:>6}  {checkpoint.kind:<8} "
            f"{checkpoint.created_at:%Y-%m-%dT%H:%M:%S}"
        )
    print(f"download one: opd export {args.job} OUT_DIR --checkpoint STEP|final", file=sys.stderr)
    return 0


def metrics_command(args: argparse.Namespace) -> int:
    text = client(args).jobs.export(
        args.job, args.format, args.keys, from_step=args.from_step, to_step=args.to_step
    )
    if args.output is None:
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"Wrote job {args.job}'s metrics ({args.format}) to {args.output}", file=sys.stderr)
    return 0


def watch_command(args: argparse.Namespace) -> int:
    job = client(args).jobs.wait(args.job, progress=True)
    print(job_line(job))
    return 0 if job.status == "succeeded" else 1


ACTION_EXAMPLE_JOBS = {"status": 1, "watch": 1, "cancel": 2, "pause": 2, "resume": 2}
"""The job each one-job command's example names: 1 is a finished job, 2 its clone."""
MAX_COMPARED = 8
COMPARED = (
    ("reverse KL", "reverse_kl"),
    ("held-out accuracy", "eval_accuracy"),
    ("held-out reverse KL", "eval_reverse_kl"),
)


def compare_command(args: argparse.Namespace) -> int:
    """Jobs side by side: their figures first and last, then every spec field they differ
    in (the dashboard's Compare page, in a terminal)."""
    if not 2 <= len(args.jobs) <= MAX_COMPARED:
        raise CommandError(f"give 2 to {MAX_COMPARED} jobs to compare, not {len(args.jobs)}")
    api = client(args)
    print("\n".join(compare_lines([api.jobs.get(job_id) for job_id in args.jobs])))
    return 0


def compare_lines(jobs: list[JobPublic]) -> list[str]:
    rows: list[tuple[str, list[str]]] = [
        ("job", [f"{job.id} {job.name}" for job in jobs]),
        ("status", [f"{job.status} {job.steps_done}/{job.total_steps}" for job in jobs]),
    ]
    for name, field in COMPARED:
        rows.append((name, [changed(getattr(job.summary, field, None)) for job in jobs]))
    teacher = [job.summary.teacher_accuracy if job.summary else None for job in jobs]
    rows.append(("teacher accuracy", ["-" if t is None else f"{t:.3g}" for t in teacher]))
    differing = differing_fields([job.spec.model_dump(mode="json") for job in jobs])
    rows += [(path, [shown_value(value) for value in values]) for path, values in differing]
    if not differing:
        rows.append(("spec", ["the same"] * len(jobs)))
    first = max(len(name) for name, _ in rows)
    width = max(len(value) for _, values in rows for value in values) + 2
    return [
        f"{name:<{first}}  " + "".join(v.ljust(width) for v in vs).rstrip() for name, vs in rows
    ]


def changed(change: Change | None) -> str:
    if change is None:
        return "-"
    first = "-" if change.first is None else f"{change.first:.3g}"
    last = "-" if change.last is None else f"{change.last:.3g}"
    return f"{first} -> {last}"


def shown_value(value: object) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value)


def action_command(args: argparse.Namespace) -> int:
    print(job_line(getattr(client(args).jobs, args.action)(args.job)))
    return 0


def label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def list_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", help="only jobs in this status, e.g. running")
    parser.add_argument("--name", help="any part of the name, ignoring case")
    parser.add_argument("--sweep", type=int, help="only this sweep's trials")
    parser.add_argument(
        "--metadata",
        type=label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only jobs whose spec has this metadata label (repeatable)",
    )
    parser.add_argument("--limit", type=count, default=20, help="how many (default 20)")
    parser.set_defaults(handler=list_command)


def create_parser(
    commands: Commands, name: str, http: argparse.ArgumentParser, text: str
) -> argparse.ArgumentParser:
    create = commands.add_parser(name, parents=[http], help=text)
    create.add_argument("spec", help="a job spec file (YAML or JSON)")
    create.add_argument("--idempotency-key", help="creating again with the same key is safe")
    create.add_argument("--quiet", action="store_true", help="print the job id only")
    create.add_argument(
        "--estimate",
        action="store_true",
        help="print what the job would use first (POST /v1/jobs/estimate), and ask before "
        "creating it when that passes what is left of the team's budget",
    )
    create.add_argument(
        "--yes", action="store_true", help="with --estimate: create it without asking"
    )
    create.set_defaults(handler=create_command)
    return create


def add_parsers(commands: Commands) -> None:
    http = api_options()
    jobs = commands.add_parser(
        "jobs", parents=[http], help="jobs: list (the default, newest first) or create"
    )
    list_options(jobs)
    example(jobs, "opd jobs --status succeeded")
    actions = jobs.add_subparsers(dest="jobs_action", metavar="ACTION")
    listing = actions.add_parser("list", parents=[http], help="jobs, newest first")
    list_options(example(listing, "opd jobs list --name tiny --limit 5"))
    create = create_parser(actions, "create", http, "create a job from a spec file")
    example(create, "opd jobs create examples/tiny.yaml --estimate --yes")
    old = create_parser(commands, "submit", http, "deprecated: opd jobs create")
    renamed(old, "opd submit", "opd jobs create")

    samples = commands.add_parser(
        "samples", parents=[http], help="rollouts a job kept, tokens shaded by reverse KL"
    )
    samples.add_argument("job", type=int, help="the job's id")
    samples.add_argument("--step", type=int, help="only this step's rollouts")
    samples.add_argument("--limit", type=count, default=4, help="how many (default 4)")
    example(samples, "opd samples 1 --limit 2")
    samples.set_defaults(handler=samples_command)

    events = commands.add_parser("events", parents=[http], help="a job's timeline, oldest first")
    events.add_argument("job", type=int, help="the job's id")
    events.add_argument("--limit", type=count, default=200, help="how many (default 200)")
    example(events, "opd events 1 --limit 10")
    events.set_defaults(handler=events_command)

    checkpoints = commands.add_parser(
        "checkpoints", parents=[http], help="a job's saved states and weights"
    )
    checkpoints.add_argument("job", type=int, help="the job's id")
    checkpoints.add_argument(
        "--kind", choices=["state", "sampler", "final"], help="only this kind (default: all)"
    )
    example(checkpoints, "opd checkpoints 1 --kind final")
    checkpoints.set_defaults(handler=checkpoints_command)

    metrics = commands.add_parser(
        "metrics", parents=[http], help="every step a job recorded, as CSV or JSON Lines"
    )
    metrics.add_argument("job", type=int, help="the job's id")
    metrics.add_argument(
        "--format", choices=["csv", "jsonl"], default="csv", help="csv (default) or JSON Lines"
    )
    metrics.add_argument("--keys", help="comma-separated metric names (default: all)")
    metrics.add_argument("--from-step", type=int, help="the first step (default: 0)")
    metrics.add_argument("--to-step", type=int, help="the last step (default: the latest)")
    metrics.add_argument("-o", "--output", help="write to this file (default: stdout)")
    example(metrics, "opd metrics 1 --keys opd/reverse_kl_mean,eval/accuracy -o job-1.csv")
    metrics.set_defaults(handler=metrics_command)


def add_action_parsers(commands: Commands) -> None:
    """The commands on one job, which `opd --help` lists last."""
    http = api_options()
    compare = commands.add_parser(
        "compare", parents=[http], help="2-8 jobs side by side: figures and spec differences"
    )
    compare.add_argument("jobs", type=int, nargs="+", metavar="JOB", help="2 to 8 job ids")
    example(compare, "opd compare 1 2")
    compare.set_defaults(handler=compare_command)
    for name, handler, text in (
        ("status", status_command, "a job's status and reverse KL"),
        ("watch", watch_command, "a live progress bar with the reverse KL until the job ends"),
        ("cancel", action_command, "cancel a job (a running one stops at a step boundary)"),
        ("pause", action_command, "pause a job, keeping its state"),
        ("resume", action_command, "resume a paused job"),
    ):
        command = commands.add_parser(name, parents=[http], help=text)
        command.add_argument("job", type=int, help="the job's id")
        command.set_defaults(handler=handler, action=name)
        example(command, f"opd {name} {ACTION_EXAMPLE_JOBS[name]}")
