"""One conformance suite for every backend, used through `connect` as the worker uses it.

Each backend (and the SDK or fake behind it) must follow the contract's signatures, sample
as asked, score aligned with the tokens, train, save and resume, refuse a state name saved
twice in a run, and fail with the service's error codes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytrio
import tinker
from pytrio.errors.auth import AuthError
from pytrio.errors.control import ControlAPIError
from pytrio.types import AdamParams, ModelInput, SamplingParams

from kernel.errors import OPDError
from kernel.spec import JobSpec
from tests.fakes import tinker as tinker_fake
from tests.fakes import trio as trio_fake
from tests.fakes.faults import fail_first
from tests.support import assert_close, named
from worker.engine.backends import connect
from worker.engine.backends.contract import (
    SamplingClient,
    ServiceClient,
    TrainingClient,
    contract_methods,
)
from worker.engine.backends.local import (
    LocalSamplingClient,
    LocalServiceClient,
    LocalTrainingClient,
)
from worker.engine.backends.tinker import TinkerSampler, TinkerService, TinkerTrainer
from worker.engine.rollouts.datums import build_opd_datum

STUDENT, TEACHER = "tiny-student", "tiny-teacher"
PROMPT = list(b"<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
PROBE = ModelInput.from_ints(PROMPT + list(b"It is 5."))


@dataclass
class Harness:
    """One backend under test: how to reach it, and how to make it fail the way it fails."""

    name: str
    connect: Callable[[], ServiceClient]
    fail_sampling: Callable[[str, int], None] | None = None
    """Make the next `n` sample calls fail with the backend's own error of a kind
    (`transient`, `auth`); None for the in-process local backend, which has no network."""


def spec_for(backend: str) -> JobSpec:
    return JobSpec.model_validate(
        named(
            {
                "backend": backend,
                "local": {"device": "cpu"},
                "trio": {"call_attempts": 2, "call_retry_delay_seconds": 0.001},
                "tinker": {"call_attempts": 2, "call_retry_delay_seconds": 0.001},
            }
        )
    )


def local_harness(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Harness:
    return Harness("local", lambda: connect(spec_for("local"), tmp_path, lambda *_: None))


def trio_harness(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Harness:
    trio_fake.patch_pytrio(monkeypatch, trio_fake.FakeServiceClient())
    native = {
        "transient": lambda: ControlAPIError("Service Unavailable", status_code=503),
        "auth": lambda: AuthError("Invalid API key", code="unauthorized"),
    }

    def fail(kind: str, times: int) -> None:
        errors = [native[kind]() for _ in range(times)]
        fail_first(monkeypatch, trio_fake.FakeSamplingClient, "sample_async", *errors)

    return Harness("trio", lambda: connect(spec_for("trio"), tmp_path, lambda *_: None), fail)


def tinker_harness(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Harness:
    tinker_fake.patch_tinker(monkeypatch, tinker_fake.FakeServiceClient())
    native = {
        "transient": lambda: tinker_fake.refused(
            tinker.InternalServerError, "Service Unavailable", status=503
        ),
        "auth": lambda: tinker_fake.refused(tinker.AuthenticationError, "Invalid API key"),
    }

    def fail(kind: str, times: int) -> None:
        """Tinker's SDK submits at once and raises where the result is awaited."""
        errors = [native[kind]() for _ in range(times)]
        sample = tinker_fake.FakeSamplingClient.sample

        def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
            return tinker_fake.failed(errors.pop(0)) if errors else sample(self, *args, **kwargs)

        monkeypatch.setattr(tinker_fake.FakeSamplingClient, "sample", flaky)

    return Harness("tinker", lambda: connect(spec_for("tinker"), tmp_path, lambda *_: None), fail)


HARNESSES = {"local": local_harness, "trio": trio_harness, "tinker": tinker_harness}
IMPLEMENTATIONS = {
    "local": (LocalServiceClient, LocalTrainingClient, LocalSamplingClient),
    "trio (the PyTRIO SDK)": (pytrio.ServiceClient, pytrio.TrainingClient, pytrio.SamplingClient),
    "trio fake": (
        trio_fake.FakeServiceClient,
        trio_fake.FakeTrainingClient,
        trio_fake.FakeSamplingClient,
    ),
    "tinker (over the Tinker SDK)": (TinkerService, TinkerTrainer, TinkerSampler),
}


REMOTE = [name for name in HARNESSES if name != "local"]


@pytest.fixture(params=list(HARNESSES))
def harness(request: pytest.FixtureRequest, monkeypatch, tmp_path) -> Harness:
    return HARNESSES[request.param](monkeypatch, tmp_path)


@pytest.fixture(params=REMOTE)
def remote(request: pytest.FixtureRequest, monkeypatch, tmp_path) -> Harness:
    """A backend behind a network, which can fail the way networks fail."""
    return HARNESSES[request.param](monkeypatch, tmp_path)


@pytest.fixture
async def training(harness: Harness) -> TrainingClient:
    service = harness.connect()
    return await service.create_lora_training_client_async(STUDENT, rank=8, seed=3)


async def draw(sampler: SamplingClient, n: int = 4, **params: Any) -> list[Any]:
    settings = {"max_tokens": 12, "seed": 7} | params
    response = await sampler.sample_async(
        ModelInput.from_ints(PROMPT), n, SamplingParams(**settings), return_text=False
    )
    return list(response.sequences)


def follows(implementation: type, contract: type) -> list[str]:
    """What keeps `implementation` from standing in for `contract` (empty: it conforms)."""
    problems = []
    for name in contract_methods(contract):
        wanted = getattr(contract, name)
        method = getattr(implementation, name, None)
        if method is None:
            problems.append(f"{name} is missing")
            continue
        if inspect.iscoroutinefunction(method) != inspect.iscoroutinefunction(wanted):
            problems.append(
                f"{name} must {'' if inspect.iscoroutinefunction(wanted) else 'not '}be async"
            )
        have = inspect.signature(method).parameters
        for param in list(inspect.signature(wanted).parameters.values())[1:]:
            if param.name not in have:
                problems.append(f"{name} takes no {param.name!r}")
            elif param.default is not param.empty and have[param.name].default is param.empty:
                problems.append(f"{name}'s {param.name!r} needs a default")
        for extra in have.values():
            optional = extra.default is not extra.empty or extra.kind in (
                extra.VAR_POSITIONAL,
                extra.VAR_KEYWORD,
            )
            if extra.name not in inspect.signature(wanted).parameters and not optional:
                problems.append(f"{name} requires {extra.name!r}, which the contract never passes")
    return problems


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_every_implementation_follows_the_contract(name):
    classes = IMPLEMENTATIONS[name]
    for implementation, contract in zip(
        classes, (ServiceClient, TrainingClient, SamplingClient), strict=True
    ):
        assert follows(implementation, contract) == [], implementation.__qualname__


async def test_sampling_honours_max_tokens_with_one_logprob_per_token(training):
    sampler = await training.save_weights_and_get_sampling_client_async()
    for max_tokens in (1, 5, 40):
        sequences = await draw(sampler, n=6, max_tokens=max_tokens)
        assert len(sequences) == 6
        for seq in sequences:
            assert 1 <= len(seq.tokens) <= max_tokens
            assert len(seq.logprobs) == len(seq.tokens)
            assert all(np.isfinite(v) and v <= 0 for v in seq.logprobs)
            assert seq.stop_reason in ("stop", "length")
            assert (seq.stop_reason == "length") == (len(seq.tokens) == max_tokens) or (
                seq.stop_reason == "stop"
            )
    longest = max(len(s.tokens) for s in await draw(sampler, n=8, max_tokens=3))
    assert longest == 3, "some completion runs to max_tokens"


async def test_the_seed_fixes_the_draws(training):
    sampler = await training.save_weights_and_get_sampling_client_async()
    again = await training.save_weights_and_get_sampling_client_async()
    first = [s.tokens for s in await draw(sampler, seed=11)]
    assert first == [s.tokens for s in await draw(again, seed=11)]
    assert first != [s.tokens for s in await draw(again, seed=12)]
    assert len({tuple(t) for t in first}) > 1, "the samples of one request differ"


async def test_top_k_one_temperature_zero_and_a_tiny_top_p_are_greedy(training):
    sampler = await training.save_weights_and_get_sampling_client_async()
    greedy = [s.tokens for s in await draw(sampler, top_k=1, temperature=1.5)]
    assert len({tuple(t) for t in greedy}) == 1
    assert [s.tokens for s in await draw(sampler, temperature=0.0)] == greedy
    assert [s.tokens for s in await draw(sampler, top_p=1e-6, seed=5)] == greedy


async def test_a_lower_temperature_draws_likelier_tokens(training):
    sampler = await training.save_weights_and_get_sampling_client_async()

    def mean_logprob(sequences: list[Any]) -> float:
        return float(np.mean([v for s in sequences for v in s.logprobs]))

    cold = mean_logprob(await draw(sampler, n=16, temperature=0.3))
    hot = mean_logprob(await draw(sampler, n=16, temperature=2.0))
    assert cold > hot + 0.5


async def test_stop_ends_a_completion_at_its_stop_token(training):
    """Each draw comes from a fresh sampler: a sampler's later requests may draw afresh."""
    fresh = training.save_weights_and_get_sampling_client_async
    eos = training.get_tokenizer().eos_token_id
    for seed in range(20):
        [free] = await draw(await fresh(), n=1, max_tokens=16, seed=seed)
        firsts = [
            i
            for i, token in enumerate(free.tokens)
            if i > 0 and token != eos and token not in free.tokens[:i]
        ]
        if firsts:
            break
    assert firsts, "some completion has a token to stop at after its first"
    end = firsts[0] + 1
    [stopped] = await draw(
        await fresh(), n=1, max_tokens=16, seed=seed, stop=[free.tokens[end - 1]]
    )
    assert stopped.tokens == free.tokens[:end]
    assert stopped.stop_reason == "stop"
    assert_close(stopped.logprobs, free.logprobs[:end])


async def test_compute_logprobs_aligns_with_the_tokens(harness, training):
    sampler = await training.save_weights_and_get_sampling_client_async()
    sequences = await draw(sampler, n=3, max_tokens=16)
    teacher = await harness.connect().create_sampling_client_async(TEACHER)
    for seq in sequences:
        tokens = ModelInput.from_ints(PROMPT + seq.tokens)
        own = await sampler.compute_logprobs_async(tokens)
        scored = await teacher.compute_logprobs_async(tokens)
        for logprobs in (own, scored):
            assert len(logprobs) == len(PROMPT) + len(seq.tokens)
            assert logprobs[0] is None and all(v is not None for v in logprobs[1:])
        assert_close(own[len(PROMPT) :], seq.logprobs, what="the sampler scores what it drew")


async def one_step(training: TrainingClient, sampler: SamplingClient) -> None:
    [seq] = await draw(sampler, n=1, max_tokens=8, seed=1)
    datum = build_opd_datum(PROMPT, seq.tokens, seq.logprobs, [1.0] * len(seq.tokens))
    fwd_bwd = await training.forward_backward_async([datum], "importance_sampling")
    optim = await training.optim_step_async(AdamParams(learning_rate=0.05))
    await fwd_bwd
    await optim


async def test_a_training_step_changes_the_weights_and_not_an_earlier_sampler(training):
    before = await training.save_weights_and_get_sampling_client_async()
    expected = await before.compute_logprobs_async(PROBE)
    await one_step(training, before)
    after = await training.save_weights_and_get_sampling_client_async()
    changed = await after.compute_logprobs_async(PROBE)
    assert np.abs(np.subtract(changed[1:], expected[1:])).max() > 1e-4
    assert await before.compute_logprobs_async(PROBE) == expected


async def test_a_saved_state_resumes_exactly(harness, training):
    await one_step(training, await training.save_weights_and_get_sampling_client_async())
    state = await (await training.save_state_async("conformance-state-000001"))
    await one_step(training, await training.save_weights_and_get_sampling_client_async())
    uninterrupted = await training.save_weights_and_get_sampling_client_async()

    service = harness.connect()
    resumed = await service.create_lora_training_client_async(STUDENT, rank=8, seed=3)
    await (await resumed.load_state_with_optimizer_async(state.path))
    await one_step(resumed, await resumed.save_weights_and_get_sampling_client_async())
    again = await resumed.save_weights_and_get_sampling_client_async()

    expected = await uninterrupted.compute_logprobs_async(PROBE)
    assert_close((await again.compute_logprobs_async(PROBE))[1:], expected[1:], rtol=1e-6)


async def test_saved_sampler_weights_sample_as_the_sampler_made_then(harness, training):
    """What the pipelined loop resumes from: a sampler of saved weights, made later or by a
    later run, draws exactly what a sampler made when they were saved draws."""
    await one_step(training, await training.save_weights_and_get_sampling_client_async())
    then = await training.save_weights_and_get_sampling_client_async()
    saved = await (await training.save_weights_for_sampler_async("conformance-000001"))
    expected = [(s.tokens, s.logprobs) for s in await draw(then, n=3, seed=5)]
    await one_step(training, await training.save_weights_and_get_sampling_client_async())
    later_run = await harness.connect().create_lora_training_client_async(STUDENT, rank=8, seed=3)

    for trainer in (training, later_run):
        loaded = await trainer.create_sampling_client_async(saved.path)
        assert [(s.tokens, s.logprobs) for s in await draw(loaded, n=3, seed=5)] == expected


async def test_a_state_name_is_saved_once_per_run(harness, training):
    await (await training.save_state_async("once"))
    with pytest.raises(OPDError) as caught:
        await (await training.save_state_async("once"))
    assert caught.value.code == "backend_rejected"
    later_run = await harness.connect().create_lora_training_client_async(STUDENT, rank=8, seed=3)
    assert (await (await later_run.save_state_async("once"))).path


async def test_a_rejected_request_is_backend_rejected(harness):
    with pytest.raises(OPDError) as caught:
        await harness.connect().create_lora_training_client_async(STUDENT, rank=65)
    assert caught.value.code == "backend_rejected"
    assert "rank" in str(caught.value)


@pytest.mark.parametrize(
    ("kind", "times", "code"),
    [("auth", 1, "backend_auth"), ("transient", 2, "backend_unavailable"), ("transient", 1, None)],
)
async def test_remote_failures_get_the_service_codes(remote, kind, times, code):
    training = await remote.connect().create_lora_training_client_async(STUDENT, rank=8, seed=3)
    sampler = await training.save_weights_and_get_sampling_client_async()
    assert remote.fail_sampling is not None
    remote.fail_sampling(kind, times)
    if code is None:
        assert await draw(sampler), "one transient failure is retried (call_attempts 2)"
        return
    with pytest.raises(OPDError) as caught:
        await draw(sampler)
    assert caught.value.code == code


async def test_a_state_loaded_without_its_optimizer_has_its_weights(harness, training):
    await one_step(training, await training.save_weights_and_get_sampling_client_async())
    state = await (await training.save_state_async("conformance-weights-000001"))
    saved = await training.save_weights_and_get_sampling_client_async()

    continued = await harness.connect().create_lora_training_client_async(STUDENT, rank=8, seed=5)
    await (await continued.load_state_async(state.path))
    loaded = await continued.save_weights_and_get_sampling_client_async()

    expected = await saved.compute_logprobs_async(PROBE)
    assert_close((await loaded.compute_logprobs_async(PROBE))[1:], expected[1:], rtol=1e-6)
    fresh = await harness.connect().create_lora_training_client_async(STUDENT, rank=8, seed=5)
    untrained = await (
        await fresh.save_weights_and_get_sampling_client_async()
    ).compute_logprobs_async(PROBE)
    assert np.abs(np.subtract(untrained[1:], expected[1:])).max() > 1e-4
