"""`opd sweeps create FILE | list | status ID | cancel ID`: sweeps through the SDK (`opd
sweep` is the old name). The file is YAML (or JSON); the API takes it as JSON."""

from __future__ import annotations

import argparse
from itertools import islice
from typing import TYPE_CHECKING, Any

from app.sweeps.schemas import SweepDetail, SweepPublic, TrialPublic
from app.web.present import number
from kernel.spec.documents import read_document
from opd.cli.common import api_options, client, count, example, page_size, renamed

if TYPE_CHECKING:
    from opd.cli.common import Commands


def read_definition(path: str) -> dict[str, Any]:
    """The sweep a YAML (or JSON) file holds; SpecError naming the file and line."""
    return read_document(path, "sweep")


SWEEP_HEADER = f"{'id':>6}  {'status':<10} {'method':<6} {'trials':>7}  name  metric: best"


def sweep_line(sweep: SweepPublic) -> str:
    best = sweep.best
    shown = (
        f"best trial {best.number} ({number(best.metric, missing='-')})" if best else "no best yet"
    )
    return (
        f"{sweep.id:>6}  {sweep.status:<10} {sweep.method:<6} "
        f"{sweep.trials_created:>3}/{sweep.trials_planned:<3} {sweep.name}  "
        f"{sweep.metric.name} ({sweep.metric.goal}): {shown}"
    )


def by_metric(trials: list[TrialPublic], maximize: bool) -> list[TrialPublic]:
    """Succeeded trials by metric, best first; then the others (stopped early or not
    finished: their last value is not comparable) by metric; those without one last."""

    def rank(trial: TrialPublic) -> tuple[bool, bool, float]:
        metric = trial.metric
        value = 0.0 if metric is None else (-metric if maximize else metric)
        return trial.status != "succeeded", metric is None, value

    return sorted(trials, key=rank)


def shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trial_table(sweep: SweepDetail) -> list[str]:
    paths = list(sweep.parameters)
    trials = sweep.trials
    width = {p: max([len(p), *(len(shown(t.values[p])) for t in trials)]) for p in paths}
    head = f"{'trial':>5}  {'job':>6}  {'status':<10} {'steps':>11}  {'metric':>10}  "
    lines = [head + "  ".join(f"{path:<{width[path]}}" for path in paths) + "  note"]
    for trial in by_metric(trials, sweep.metric.goal == "maximize"):
        values = "  ".join(f"{shown(trial.values[p]):<{width[p]}}" for p in paths)
        steps = f"{trial.steps_done}/{trial.total_steps}"
        lines.append(
            f"{trial.number:>5}  {trial.job_id:>6}  {trial.status:<10} {steps:>11}  "
            f"{number(trial.metric, missing='-'):>10}  {values}  {trial.stop_reason or ''}"
        )
    return lines


def sweep_command(args: argparse.Namespace) -> int:
    api = client(args)
    if args.sweep_action == "create":
        sweep = api.sweeps.create(read_definition(args.file))
        print(sweep.id if args.quiet else f"Created sweep {sweep.id} ({sweep.status})")
    elif args.sweep_action == "list":
        shown = list(islice(api.sweeps.list(page_size=page_size(args.limit, 100)), args.limit))
        if not shown:
            print("no sweeps")
        else:
            print(SWEEP_HEADER)
        for listed in shown:
            print(sweep_line(listed))
    elif args.sweep_action == "cancel":
        print(SWEEP_HEADER)
        print(sweep_line(api.sweeps.cancel(args.sweep)))
    else:
        sweep = api.sweeps.get(args.sweep)
        print(SWEEP_HEADER)
        print(sweep_line(sweep))
        if sweep.error:
            print(f"error: {sweep.error}")
        for line in trial_table(sweep):
            print(line)
        print(f"steps early stopping saved: {sweep.steps_saved}")
    return 0


def add_parsers(commands: Commands) -> None:
    for name in ("sweeps", "sweep"):
        sweep = commands.add_parser(
            name,
            help="searches over a job spec (trials are jobs)"
            if name == "sweeps"
            else "deprecated: opd sweeps",
        )
        sweep_actions(sweep)
    renamed(sweep, "opd sweep", "opd sweeps")


def sweep_actions(sweep: argparse.ArgumentParser) -> None:
    http = api_options()
    actions = sweep.add_subparsers(dest="sweep_action", required=True, metavar="ACTION")
    create = actions.add_parser("create", parents=[http], help="start a sweep from a YAML file")
    create.add_argument("file", help="a sweep file (YAML or JSON)")
    create.add_argument("--quiet", action="store_true", help="print the sweep id only")
    example(create, "opd sweeps create examples/sweep-tiny.yaml")
    listing = actions.add_parser("list", parents=[http], help="sweeps, newest first")
    listing.add_argument("--limit", type=count, default=20, help="how many (default 20)")
    example(listing, "opd sweeps list")
    for name, text in (
        ("status", "a sweep and its trials, best metric first"),
        ("cancel", "cancel a sweep and its unfinished trials"),
    ):
        action = actions.add_parser(name, parents=[http], help=text)
        action.add_argument("sweep", type=int, help="the sweep's id")
        example(action, f"opd sweeps {name} 1")
    sweep.set_defaults(handler=sweep_command)
