"""Several teachers and datasets through the whole service: a routed job with a reward runs
on the local backend to success, with per-dataset curves, evals and the probe's event."""

from __future__ import annotations

import pytest

from opd.sdk import Client
from tests.e2e.conftest import Service


def two_teacher_spec() -> dict:
    return {
        "name": "mopd-e2e",
        "backend": "local",
        "student": {"base_model": "tiny-student", "lora_rank": 8},
        "teachers": {"a": {"base_model": "tiny-teacher"}, "b": {"base_model": "tiny-teacher"}},
        "datasets": [
            {"name": "add", "source": "arithmetic", "ops": ["add"], "count": 20, "teacher": "a"},
            {
                "name": "mul",
                "source": "arithmetic",
                "ops": ["mul"],
                "count": 20,
                "weight": 2,
                "teacher": "b",
            },
        ],
        "sampling": {"max_tokens": 8},
        "loop": {"steps": 3, "batch_size": 3, "group_size": 2, "reward": {"coef": 0.5}},
        "eval": {"holdout": 2, "max_tokens": 8},
    }


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_two_teacher_job_records_each_datasets_curves(service: Service):
    service.start_worker()
    job = service.submit(two_teacher_spec())

    done = service.wait(job["id"])

    assert done["status"] == "succeeded", service.logs()
    client = service.client()
    for key, value in (("data/datums/add", 2.0), ("data/datums/mul", 4.0)):
        assert [v for _, v in curve(client, job["id"], key)] == [value] * 3
    for key in ("opd/reverse_kl_mean/add", "opd/reverse_kl_mean/mul", "reward/mean/mul"):
        assert [step for step, _ in curve(client, job["id"], key)] == [0, 1, 2], key
    for key in ("usage/teacher_tokens/a", "usage/teacher_tokens/b"):
        assert all(v > 0 for _, v in curve(client, job["id"], key)), key
    for key in ("eval/accuracy/add", "eval/reverse_kl_mean/mul"):
        assert [step for step, _ in curve(client, job["id"], key)] == [0, 3], key
    messages = " | ".join(event.message for event in service.events(job["id"]))
    assert "Probe reverse KL per teacher: a " in messages
    assert "(dataset mul)" in messages


def curve(client: Client, job_id: int, key: str) -> list[tuple[int, float | None]]:
    return client.jobs.metrics(job_id, key, max_points=10_000).points(key)
