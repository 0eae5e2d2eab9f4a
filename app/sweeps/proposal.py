"""The sweep the dashboard proposes around a job: one the service accepts, over what matters
for that job. Pure: the job's spec in, a sweep definition out."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from kernel.merge_patch import dotted_patch, merge_patch
from kernel.spec import JobSpec

OBJECTIVES = ("sampled_reverse_kl", "jsd")
"""The reference's objective and the one the project's benchmark ranks first; a proposal
searches the two where the job's backend and teachers can train both."""


def starting_definition(job_id: int, spec: dict[str, Any]) -> dict[str, Any]:
    """A sweep around job `job_id`: its learning rate / 3 .. * 3 and, where both train, the
    objective; by its held-out accuracy where it has an eval, with ASHA's rungs at its eval
    steps (min_steps = eval.every, each rung eta times the last), else by the reverse KL."""
    rate = spec.get("optim", {}).get("learning_rate", 1e-4)
    steps = spec.get("loop", {}).get("steps", 9)
    every = (spec.get("eval") or {}).get("every", 0)
    parameters: dict[str, Any] = {
        "optim.learning_rate": {
            "min": float(f"{rate / 3:.3g}"),
            "max": float(f"{rate * 3:.3g}"),
            "distribution": "log_uniform",
        }
    }
    if len(objectives := trainable_objectives(spec)) > 1:
        parameters["loop.objective"] = {"values": objectives}
    evaluated = spec.get("eval") is not None
    return {
        "name": f"{spec.get('name', 'job')}-sweep"[:100],
        "base_job": job_id,
        "parameters": parameters,
        "method": "tpe",
        "metric": {"name": "eval/accuracy", "goal": "maximize"}
        if evaluated
        else {"name": "opd/reverse_kl_mean", "goal": "minimize"},
        "max_trials": 8,
        "parallel": 2,
        "seed": 0,
        "early_stop": {
            "type": "asha",
            "min_steps": every if evaluated and every else max(1, steps // 9),
            "eta": 3,
        },
    }


def trainable_objectives(spec: dict[str, Any]) -> list[str]:
    """Those of OBJECTIVES the job's spec accepts with nothing else changed (its backend,
    teachers, loss and discount decide: the spec's own rules, not a copy of them)."""
    kept = []
    for kind in OBJECTIVES:
        try:
            JobSpec.model_validate(merge_patch(spec, dotted_patch({"loop.objective": kind})))
        except ValidationError:
            continue
        kept.append(kind)
    return kept
