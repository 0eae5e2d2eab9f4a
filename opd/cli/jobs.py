"""The commands on the API's jobs: `opd submit`, `opd jobs` (the list), `opd samples` (the
rollouts a job kept), and, on one job, `status`, `watch`, `cancel`, `pause` and `resume`."""

from __future__ import annotations

import argparse
from itertools import islice
from typing import TYPE_CHECKING

from kernel.spec import load_spec
from kernel.summary import summary_lines
from opd.cli.common import api_options, client, count, page_size
from opd.cli.shading import sample_text, wants_color

if TYPE_CHECKING:
    from app.jobs.schemas import JobPublic
    from opd.cli.common import Commands


def job_line(job: JobPublic) -> str:
    error = f"  [{job.error.code}] {job.error.message}" if job.error else ""
    trial = f"  sweep {job.sweep_id} trial {job.sweep_trial}" if job.sweep_id else ""
    stopped = f" ({job.stop_reason})" if job.stop_reason else ""
    return (
        f"{job.id:>6}  {job.status:<10} {job.steps_done:>6}/{job.total_steps:<6} "
        f"{job.name}{stopped}{trial}{error}"
    )


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
    if job.queue_reason:
        print(f"queue_reason: {job.queue_reason}")
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


def watch_command(args: argparse.Namespace) -> int:
    job = client(args).jobs.wait(args.job, progress=True)
    print(job_line(job))
    return 0 if job.status == "succeeded" else 1


def action_command(args: argparse.Namespace) -> int:
    print(job_line(getattr(client(args).jobs, args.action)(args.job)))
    return 0


def add_parsers(commands: Commands) -> None:
    http = api_options()
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


def add_action_parsers(commands: Commands) -> None:
    """The commands on one job, which `opd --help` lists last."""
    http = api_options()
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
