"""The sweep the dashboard proposes around a job is one the service accepts: the dashboard's
Sweep button used to pre-fill `loop.loss_fn: [importance_sampling, ppo]` for a jsd job (ppo
is refused with a logit-level objective) and an ASHA rung at step 4 of a job that evaluates
every 20."""

from __future__ import annotations

import itertools
from pathlib import Path

import yaml

from app.sweeps.proposal import starting_definition
from kernel.merge_patch import dotted_patch, merge_patch
from kernel.spec import JobSpec

ROOT = Path(__file__).resolve().parents[3]


def demo(**loop: object) -> dict:
    spec = yaml.safe_load((ROOT / "examples" / "arith.yaml").read_text())
    spec["loop"] |= {"steps": 40, **loop}
    spec["eval"] |= {"every": 20}
    return JobSpec.model_validate(spec).model_dump(mode="json")


def trials(definition: dict, spec: dict) -> list[JobSpec]:
    """The trial specs at every corner of the proposal's search."""
    values = {
        path: space.get("values") or [space["min"], space["max"]]
        for path, space in definition["parameters"].items()
    }
    corners = [
        dict(zip(values, chosen, strict=True)) for chosen in itertools.product(*values.values())
    ]
    return [JobSpec.model_validate(merge_patch(spec, dotted_patch(c))) for c in corners]


def test_a_jsd_jobs_proposal_searches_rate_and_objective_at_its_eval_steps() -> None:
    spec = demo()  # the demo trains jsd
    definition = starting_definition(7, spec)
    assert set(definition["parameters"]) == {"optim.learning_rate", "loop.objective"}
    assert definition["parameters"]["loop.objective"]["values"] == ["sampled_reverse_kl", "jsd"]
    assert definition["early_stop"]["min_steps"] == 20
    assert len(trials(definition, spec)) == 4  # every corner is a job the service accepts


def test_a_job_whose_loss_rules_out_jsd_searches_its_rate_alone() -> None:
    spec = demo(objective="sampled_reverse_kl", loss_fn="ppo", kl_discount_factor=0.5)
    definition = starting_definition(7, spec)
    assert set(definition["parameters"]) == {"optim.learning_rate"}
    assert len(trials(definition, spec)) == 2


def test_a_remote_backends_proposal_keeps_to_what_it_trains() -> None:
    spec = yaml.safe_load((ROOT / "examples" / "deepmath-trio.yaml").read_text())
    spec = JobSpec.model_validate(spec).model_dump(mode="json")
    definition = starting_definition(3, spec)
    assert "loop.objective" not in definition["parameters"]
    assert trials(definition, spec)
