"""What a sweep's next trial tries, as pure functions of its definition and its history.

Every suggestion depends only on the sweep (its seed) and the trials the database holds,
so a controller that dies and is replaced suggests the same trial again: grid takes the
product's n-th point, random draws from a generator seeded by (seed, trial number), and
TPE rebuilds an Optuna study from the history by ask-and-tell, then asks once more.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState
from pydantic import ValidationError

from app.jobs.errors import SpecRefused
from app.sweeps.schemas import Parameter, ParameterValue, SweepCreate, SweepMethod
from kernel.merge_patch import dotted_patch, merge_patch
from kernel.spec import JobSpec, format_validation_error, validation_problems

optuna.logging.set_verbosity(optuna.logging.WARNING)

Values = dict[str, ParameterValue]


@dataclass(frozen=True)
class Observation:
    """A trial as the search sees it: its values, its state and its metric (None: none yet)."""

    values: Values
    state: TrialState
    metric: float | None = None


class InvalidTrial(SpecRefused):
    """A parameter value that makes the spec invalid; `param` names the parameter."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"parameters.{param}", message)


def get_path(spec: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of a spec (None where the path is absent)."""
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def as_swept(value: Any) -> Any:
    """A trial's value as the sweep gave it: the spec stores a group named by its kind
    (`objective: jsd` is `{kind: jsd, ...}`), and a sweep lists the names."""
    return value["kind"] if isinstance(value, dict) and "kind" in value else value


WHOLE_NUMBERS = (
    "; a uniform or log_uniform range draws fractional values, so a field of whole numbers "
    "needs distribution: int_uniform (or values: [...])"
)


def trial_spec(base: dict[str, Any], values: Values, name: str) -> JobSpec:
    """`base` with the trial's values, validated as any job spec; InvalidTrial names the
    parameter whose value the spec refuses."""
    spec = merge_patch(base, dotted_patch(dict(values)) | {"name": name})
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as error:
        fractional = any(problem["type"] == "int_from_float" for problem in error.errors())
        for problem_path, message in validation_problems(error):
            for param in values:
                if problem_path == param or problem_path.startswith(f"{param}."):
                    hint = WHOLE_NUMBERS if fractional else ""
                    raise InvalidTrial(param, f"{values[param]!r}: {message}{hint}") from None
        first = sorted(values)[0]
        raise InvalidTrial(
            first, f"these values make an invalid spec: {format_validation_error(error)}"
        ) from None


def grid(sweep: SweepCreate) -> list[Values]:
    """The product of every parameter's values, in the order the parameters are given."""
    paths = list(sweep.parameters)
    choices = [sweep.parameters[path].values or [] for path in paths]
    return [dict(zip(paths, point, strict=True)) for point in itertools.product(*choices)]


def grid_size(sweep: SweepCreate) -> int:
    return math.prod(len(p.values or []) for p in sweep.parameters.values())


def planned_trials(sweep: SweepCreate) -> int:
    """How many trials the sweep runs: the grid's size, else max_trials."""
    if sweep.method is SweepMethod.grid:
        return grid_size(sweep)
    return sweep.max_trials


def extremes(sweep: SweepCreate) -> list[Values]:
    """Values that test each parameter alone against the base: each listed value, and
    each range's ends and, for a range of fractional numbers, one inside it (a field of
    whole numbers takes the ends, 1.0 and 4.0, but not what is drawn between them); the
    others at their first value or low end."""
    first = {path: lowest(p) for path, p in sweep.parameters.items()}
    probes = []
    for path, parameter in sweep.parameters.items():
        tried = parameter.values or [lowest(parameter), highest(parameter)]
        if parameter.values is None and parameter.distribution != "int_uniform":
            tried.append(fractional_inside(parameter))
        probes.extend(first | {path: value} for value in tried)
    return probes


def fractional_inside(parameter: Parameter) -> float:
    """A value of the range that is not a whole number: its middle, or the float just above."""
    assert parameter.min is not None and parameter.max is not None
    middle = (parameter.min + parameter.max) / 2
    return middle if not middle.is_integer() else math.nextafter(middle, parameter.max)


def lowest(parameter: Parameter) -> ParameterValue:
    if parameter.values is not None:
        return parameter.values[0]
    assert parameter.min is not None
    return int(parameter.min) if parameter.distribution == "int_uniform" else parameter.min


def highest(parameter: Parameter) -> ParameterValue:
    assert parameter.max is not None
    return int(parameter.max) if parameter.distribution == "int_uniform" else parameter.max


def draw(parameter: Parameter, rng: random.Random) -> ParameterValue:
    if parameter.values is not None:
        return rng.choice(parameter.values)
    assert parameter.min is not None and parameter.max is not None
    if parameter.distribution == "int_uniform":
        return rng.randint(int(parameter.min), int(parameter.max))
    if parameter.distribution == "log_uniform":
        return math.exp(rng.uniform(math.log(parameter.min), math.log(parameter.max)))
    return rng.uniform(parameter.min, parameter.max)


def random_values(sweep: SweepCreate, number: int) -> Values:
    """Trial `number`'s draw: the same for the same seed, whatever ran before it."""
    rng = random.Random(f"{sweep.seed}:{number}")
    return {path: draw(parameter, rng) for path, parameter in sweep.parameters.items()}


def distribution(parameter: Parameter) -> BaseDistribution:
    if parameter.values is not None:
        return CategoricalDistribution(parameter.values)
    assert parameter.min is not None and parameter.max is not None
    if parameter.distribution == "int_uniform":
        return IntDistribution(int(parameter.min), int(parameter.max))
    return FloatDistribution(
        parameter.min, parameter.max, log=parameter.distribution == "log_uniform"
    )


def startup_trials(sweep: SweepCreate) -> int:
    """Random trials before TPE models the history: a third of the budget, 2 to 10."""
    return min(10, max(2, sweep.max_trials // 3))


def tpe_values(sweep: SweepCreate, number: int, history: Sequence[Observation]) -> Values:
    """Rebuild the study from the history by ask-and-tell (each past trial's values are
    enqueued, asked for and told its outcome; running ones stay asked, so the constant
    liar keeps new suggestions away from them), then ask for trial `number`."""
    sampler = optuna.samplers.TPESampler(
        seed=sweep.seed * 100_003 + number, n_startup_trials=startup_trials(sweep)
    )
    direction = "maximize" if sweep.metric.goal == "maximize" else "minimize"
    study = optuna.create_study(direction=direction, sampler=sampler)
    distributions = {path: distribution(p) for path, p in sweep.parameters.items()}
    for past in history:
        study.enqueue_trial(dict(past.values), skip_if_exists=False)
        trial = study.ask(distributions)
        if past.state == TrialState.COMPLETE and past.metric is not None:
            study.tell(trial, past.metric)
        elif past.state == TrialState.PRUNED:
            if past.metric is not None:
                trial.report(past.metric, 0)
            study.tell(trial, state=TrialState.PRUNED)
        elif past.state != TrialState.RUNNING:
            study.tell(trial, state=TrialState.FAIL)
    return dict(study.ask(distributions).params)


def suggest(sweep: SweepCreate, number: int, history: Sequence[Observation]) -> Values:
    """The values of trial `number` (1-based), given the trials before it."""
    if sweep.method is SweepMethod.grid:
        return grid(sweep)[number - 1]
    if sweep.method is SweepMethod.random:
        return random_values(sweep, number)
    return tpe_values(sweep, number, history)
