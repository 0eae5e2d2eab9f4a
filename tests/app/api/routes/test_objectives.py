"""`loop.objective` per backend through the real API: an objective a backend cannot train
exactly is a 422 at `POST /v1/jobs` naming the objective and the backend, and nothing is
stored; the one Tinker trains (forward_kl over the teacher's top-k, no tail) is accepted."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.spec.loop import LOGIT_OBJECTIVES
from tests.app.api.routes.test_spec_contents import nothing_stored
from tests.app.conftest import auth, small_spec

TINKER_TOPK = {"kind": "forward_kl", "top_k": 20, "tail": False}
TWO_TEACHERS = {"a": {"base_model": "Qwen/Qwen3-8B"}, "b": {"base_model": "Qwen/Qwen3-8B"}}


def objective(kind: str, **options: Any) -> dict[str, Any]:
    return {"objective": {"kind": kind, **options}}


def trio(kind: str, top_k: int) -> dict[str, Any]:
    """backend trio with `kind` over the full vocabulary, or over a top-k without a tail."""
    return {"backend": "trio", "loop": objective(kind, top_k=top_k, tail=False if top_k else None)}


REFUSED = {
    **{
        f"trio {kind}{' top-k' if top_k else ''}": (
            trio(kind, top_k),
            "loop.objective.kind",
            kind,
        )
        for kind in LOGIT_OBJECTIVES
        for top_k in (0, 20)
    },
    "tinker reverse_kl": (
        {"backend": "tinker", "loop": objective("reverse_kl")},
        "loop.objective.kind",
        "reverse_kl",
    ),
    "tinker reverse_kl top-k": (
        {"backend": "tinker", "loop": objective("reverse_kl", top_k=20, tail=False)},
        "loop.objective.kind",
        "reverse_kl",
    ),
    "tinker forward_kl over the full vocabulary": (
        {"backend": "tinker", "loop": objective("forward_kl")},
        "loop.objective.kind",
        "forward_kl",
    ),
    "tinker forward_kl with a tail": (
        {"backend": "tinker", "loop": objective("forward_kl", top_k=20)},
        "loop.objective.kind",
        "forward_kl",
    ),
    "tinker jsd": (
        {"backend": "tinker", "loop": objective("jsd", top_k=20, tail=False)},
        "loop.objective.kind",
        "jsd",
    ),
    "tinker forward_kl against a mixture": (
        {
            "backend": "tinker",
            "teachers": TWO_TEACHERS,
            "teacher_mixture": "mixture",
            "loop": {"objective": TINKER_TOPK},
        },
        "teacher_mixture",
        "forward_kl",
    ),
    "tinker forward_kl with dro's reward": (
        {
            "backend": "tinker",
            "loop": {"objective": TINKER_TOPK, "loss_fn": "dro", "reward": {"coef": 1.0}},
        },
        "loop.loss_fn",
        "forward_kl",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_an_objective_the_backend_cannot_train_is_a_422_naming_both(client, key, case):
    groups, param, kind = REFUSED[case]
    backend = groups["backend"]

    response = await client.post("/v1/jobs", json=small_spec(**groups), headers=auth(key))

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert f"backend {backend}" in error["message"] and kind in error["message"], error
    await nothing_stored(client, key)


@pytest.mark.parametrize(
    "loop",
    [
        {"objective": TINKER_TOPK},
        {"objective": TINKER_TOPK, "loss_fn": "ppo", "reward": {"coef": 1.0}},
    ],
)
async def test_tinkers_forward_kl_over_the_teachers_top_k_is_accepted(client, key, loop):
    response = await client.post(
        "/v1/jobs", json=small_spec(backend="tinker", loop=loop), headers=auth(key)
    )
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["loop"]["objective"]["top_k"] == 20
