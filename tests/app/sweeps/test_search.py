"""What a sweep's trials try: the grid's every point, reproducible random draws, TPE through
Optuna's ask-and-tell on a history, and values checked as job specs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from optuna.trial import TrialState

from app.sweeps.schemas import SweepCreate
from app.sweeps.search import (
    InvalidTrial,
    Observation,
    extremes,
    grid,
    planned_trials,
    suggest,
    trial_spec,
)
from tests.app.conftest import small_spec


def sweep(**fields: Any) -> SweepCreate:
    return SweepCreate.model_validate(
        {
            "name": "s",
            "base": small_spec(),
            "metric": {"name": "eval/accuracy", "goal": "maximize"},
            "parameters": {
                "optim.learning_rate": {"min": 1e-4, "max": 1e-1, "distribution": "log_uniform"},
                "loop.loss_fn": {"values": ["importance_sampling", "ppo"]},
                "student.lora_rank": {"min": 4, "max": 64, "distribution": "int_uniform"},
            },
            "method": "random",
            "max_trials": 20,
        }
        | fields
    )


def test_grid_is_the_product_of_the_values_in_order() -> None:
    search = sweep(
        method="grid",
        max_trials=6,
        parameters={
            "loop.loss_fn": {"values": ["ppo", "cispo"]},
            "student.lora_rank": {"values": [8, 16, 32]},
        },
    )
    points = [suggest(search, n, []) for n in range(1, planned_trials(search) + 1)]
    assert planned_trials(search) == 6
    assert points == grid(search)
    assert {(p["loop.loss_fn"], p["student.lora_rank"]) for p in points} == {
        (loss, rank) for loss in ("ppo", "cispo") for rank in (8, 16, 32)
    }


def test_random_draws_depend_on_the_seed_and_trial_number_only() -> None:
    first = [suggest(sweep(seed=7), n, []) for n in range(1, 11)]
    history = [Observation(v, TrialState.COMPLETE, 0.5) for v in first]
    again = [suggest(sweep(seed=7), n, history[: n - 1]) for n in range(1, 11)]
    other = [suggest(sweep(seed=8), n, []) for n in range(1, 11)]
    assert first == again
    assert first != other
    assert len({v["optim.learning_rate"] for v in first}) == 10
    for values in first:
        assert 1e-4 <= values["optim.learning_rate"] <= 1e-1
        assert (
            isinstance(values["student.lora_rank"], int) and 4 <= values["student.lora_rank"] <= 64
        )
        assert values["loop.loss_fn"] in ("importance_sampling", "ppo")


def objective(values: dict[str, Any]) -> float:
    """Best at learning_rate 1e-2 with ppo: what TPE should find."""
    distance = (math.log10(values["optim.learning_rate"]) + 2) ** 2
    return -distance - (0.0 if values["loop.loss_fn"] == "ppo" else 1.0)


def test_tpe_learns_from_the_told_history_by_ask_and_tell() -> None:
    search = sweep(
        method="tpe",
        parameters={
            k: v.model_dump() for k, v in sweep().parameters.items() if k != "student.lora_rank"
        },
    )
    history: list[Observation] = []
    for number in range(1, 21):
        values = suggest(search, number, history)
        assert suggest(search, number, history) == values  # rebuilt from the history alike
        history.append(Observation(values, TrialState.COMPLETE, objective(values)))
    startup = [o.metric for o in history[:6]]
    modelled = [o.metric for o in history[-8:]]
    assert sorted(modelled)[len(modelled) // 2] > sorted(startup)[len(startup) // 2]
    assert sum(o.values["loop.loss_fn"] == "ppo" for o in history[-8:]) >= 6


def test_tpe_keeps_away_from_running_trials() -> None:
    """A running trial is asked but not told: the constant liar counts it, so the next
    suggestion differs from what the same history without it gives."""
    search = sweep(method="tpe")
    history = [
        Observation(suggest(search, n, []), TrialState.COMPLETE, float(n))
        for n in (1, 2, 3, 4, 5, 6, 7)
    ]
    running = Observation(suggest(search, 8, history), TrialState.RUNNING)
    assert suggest(search, 9, [*history, running]) != suggest(search, 9, history)


def test_a_value_that_makes_an_invalid_spec_names_its_parameter() -> None:
    search = sweep(parameters={"student.lora_rank": {"values": [8, 2]}})
    with pytest.raises(InvalidTrial) as refused:
        for values in extremes(search):
            trial_spec(small_spec(), values, "s-1")
    assert refused.value.param == "parameters.student.lora_rank"
    assert "2" in str(refused.value)
    with pytest.raises(InvalidTrial) as unknown:
        trial_spec(small_spec(), {"optim.lr": 0.1}, "s-1")
    assert unknown.value.param == "parameters.optim.lr"


def test_a_trial_spec_is_the_base_with_the_values_at_their_paths() -> None:
    spec = trial_spec(small_spec(), {"optim.learning_rate": 0.01, "eval.holdout": 1}, "s-3")
    assert spec.optim.learning_rate == 0.01
    assert spec.eval is not None and spec.eval.holdout == 1  # a null group is made
    assert spec.name == "s-3"
    assert spec.loop.steps == small_spec()["loop"]["steps"]


SWEEP_EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("sweep-*.yaml"))


@pytest.mark.parametrize("path", SWEEP_EXAMPLES, ids=lambda path: path.name)
def test_every_example_sweep_is_valid(path: Path) -> None:
    example = SweepCreate.model_validate(yaml.safe_load(path.read_text()))
    assert example.base is not None
    for values in extremes(example):
        trial_spec(example.base, values, example.name)
    assert planned_trials(example) == example.max_trials
