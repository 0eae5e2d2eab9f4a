"""Backend errors: transient ones are retried (visibly, boundedly), permanent ones fail at once.

Faults are PyTRIO's own error types (and the network errors beneath them), raised by the
fake PyTRIO service before a call reaches it, unless a test says otherwise.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytrio.errors.actor import ActorAPIError
from pytrio.errors.auth import AuthError
from pytrio.errors.base import PyTrioError, ValidationError
from pytrio.errors.control import ControlAPIError
from pytrio.types import APIFuture

from kernel.errors import OPDError
from kernel.spec import JobSpec
from tests.fakes.faults import fail_first
from tests.fakes.sinks import RecordingSink
from tests.fakes.trio import (
    FakeSamplingClient,
    FakeServiceClient,
    FakeTrainingClient,
    patch_pytrio,
)
from worker.engine.loop.job import run_job
from worker.service.tasks import failure_of

PROMPTS = ["What is 1 + 1?", "Name a prime.", "Is 9 square?"]
TIMING = {"data/completion_tokens_per_second"}


def make_spec(*, batch_size: int = 2, call_attempts: int = 4) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": "trio",
            "student": {"base_model": "student/model", "lora_rank": 8},
            "teacher": {"base_model": "teacher/model"},
            "dataset": {"source": "inline", "prompts": PROMPTS},
            "sampling": {"max_tokens": 6},
            "loop": {"steps": 3, "batch_size": batch_size, "group_size": 2, "save_every": 2},
            "trio": {"call_attempts": call_attempts, "call_retry_delay_seconds": 0.001},
        }
    )


async def run(
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeServiceClient,
    spec: JobSpec,
    tmp_path: Path,
    sink: RecordingSink | None = None,
) -> RecordingSink:
    """A whole job through `run_job`, so the backend is opened by `connect` as in service."""
    patch_pytrio(monkeypatch, fake)
    sink = sink or RecordingSink()
    await run_job(spec, sink, artifact_dir=tmp_path / "artifacts", data_root=tmp_path)
    return sink


def warnings_of(sink: RecordingSink) -> list[str]:
    return [message for level, message, _ in sink.events if level == "warning"]


def without_timing(steps: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    return {
        step: {k: v for k, v in m.items() if not k.startswith("time/") and k not in TIMING}
        for step, m in steps.items()
    }


async def test_transient_failures_are_retried_and_change_nothing(monkeypatch, tmp_path) -> None:
    spec = make_spec()
    clean_fake = FakeServiceClient()
    clean = await run(monkeypatch, clean_fake, spec, tmp_path / "clean")
    faults = [
        fail_first(
            monkeypatch,
            FakeServiceClient,
            "create_lora_training_client_async",
            TimeoutError("connect timed out"),
        ),
        fail_first(
            monkeypatch,
            FakeSamplingClient,
            "sample_async",
            ControlAPIError("Service Unavailable", status_code=503, code="service_unavailable"),
            ActorAPIError("Too Many Requests", status_code=429, code="too_many_requests"),
        ),
        fail_first(
            monkeypatch,
            FakeSamplingClient,
            "compute_logprobs_async",
            ConnectionError("connection reset by peer"),
            httpx.ReadError("peer closed the connection"),
        ),
        fail_first(
            monkeypatch,
            FakeTrainingClient,
            "forward_backward_async",
            PyTrioError("Bad Gateway", status_code=502),
        ),
        fail_first(
            monkeypatch,
            FakeTrainingClient,
            "optim_step_async",
            ActorAPIError("Gateway Timeout", status_code=504, code="actor.request_failed"),
        ),
        fail_first(monkeypatch, FakeTrainingClient, "save_state_async", TimeoutError()),
        fail_first(
            monkeypatch, FakeTrainingClient, "save_weights_for_sampler_async", ConnectionError()
        ),
    ]
    fake = FakeServiceClient()

    faulted = await run(monkeypatch, fake, spec, tmp_path / "faulted")

    assert all(not pending for pending in faults), "every fault was met and retried"
    assert without_timing(faulted.steps) == without_timing(clean.steps)
    assert Counter(call.name for call in fake.calls) == Counter(
        call.name for call in clean_fake.calls
    ), "no call took effect twice"
    warnings = warnings_of(faulted)
    assert len(warnings) == 9
    for call in ("create_lora_training_client", "sample", "compute_logprobs", "optim_step"):
        assert any(f"Retrying backend call {call} (try 2 of 4)" in w for w in warnings), call
    assert any("Too Many Requests (too_many_requests, HTTP 429)" in w for w in warnings)


@pytest.mark.parametrize(
    ("error", "code", "advice"),
    [
        (AuthError("Invalid API key", code="unauthorized"), "backend_auth", "PYTRIO_API_KEY"),
        (
            ControlAPIError("Forbidden", status_code=403, code="forbidden"),
            "backend_auth",
            "do not have permission",
        ),
        (
            ControlAPIError("Bad Request", status_code=400, code="validation_failed"),
            "backend_rejected",
            "Check the request arguments",
        ),
        (
            ValidationError("rank must be in [4, 64]", code="validation.invalid_lora_rank"),
            "backend_rejected",
            "rank must be in [4, 64]",
        ),
        (
            ControlAPIError("No such model", status_code=404, code="model_not_found"),
            "backend_rejected",
            "Choose a supported model",
        ),
    ],
)
async def test_a_permanent_failure_fails_the_job_at_once(
    monkeypatch, tmp_path, error: PyTrioError, code: str, advice: str
) -> None:
    fake = FakeServiceClient()
    pending = fail_first(
        monkeypatch, FakeServiceClient, "create_lora_training_client_async", error, error
    )
    sink = RecordingSink()

    with pytest.raises(OPDError) as caught:
        await run(monkeypatch, fake, make_spec(), tmp_path, sink)

    assert caught.value.code == code
    assert caught.value.__cause__ is error
    assert advice in str(caught.value)
    assert len(pending) == 1, "not retried"
    assert not warnings_of(sink)
    assert not fake.calls
    assert failure_of(caught.value) == (code, str(caught.value))


async def test_retries_are_bounded_and_exhaustion_says_what_to_do(monkeypatch, tmp_path) -> None:
    fake = FakeServiceClient()
    outage = [ControlAPIError("Service Unavailable", status_code=503) for _ in range(10)]
    pending = fail_first(monkeypatch, FakeSamplingClient, "sample_async", *outage)
    sink = RecordingSink()

    with pytest.raises(OPDError) as caught:
        await run(monkeypatch, fake, make_spec(batch_size=1, call_attempts=3), tmp_path, sink)

    assert caught.value.code == "backend_unavailable"
    message = str(caught.value)
    assert "backend call sample kept failing (3 tries)" in message
    assert "HTTP 503" in message
    assert "trio.call_attempts" in message
    assert len(pending) == 7
    assert len(warnings_of(sink)) == 2
    assert not fake.calls_named("forward_backward")
    assert failure_of(caught.value)[0] == "backend_unavailable"


async def test_a_lost_training_result_is_not_repeated(monkeypatch, tmp_path) -> None:
    """forward_backward took effect (gradients accumulated) but its result failed: sending it
    again would train on the batch twice, so the job fails instead."""
    fake = FakeServiceClient()
    sent = FakeTrainingClient.forward_backward_async

    async def result_lost(self: FakeTrainingClient, *args: Any, **kwargs: Any) -> APIFuture:
        await sent(self, *args, **kwargs)
        lost: Future[Any] = Future()
        lost.set_exception(ActorAPIError("Event poll failed", status_code=503))
        return APIFuture(lost)

    monkeypatch.setattr(FakeTrainingClient, "forward_backward_async", result_lost)
    sink = RecordingSink()

    with pytest.raises(OPDError) as caught:
        await run(monkeypatch, fake, make_spec(), tmp_path, sink)

    assert caught.value.code == "backend_unavailable"
    assert "may have taken effect, so it was not repeated" in str(caught.value)
    assert len(fake.calls_named("forward_backward")) == 1
    assert not warnings_of(sink)
