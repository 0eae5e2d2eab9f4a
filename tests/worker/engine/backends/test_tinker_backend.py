"""The `tinker` backend: the login check, what reaches Tinker's SDK, how Tinker's errors read,
the fake's fidelity to the SDK, and an opt-in live run."""

from __future__ import annotations

import inspect
import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pydantic
import pytest
import tinker
from pytrio.types import AdamParams, ModelInput, SamplingParams
from tinker.lib.credentials import JsonCredentialStore, ManualKey, default_credentials_path
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture
from tinker.types import RequestErrorCategory

from kernel.errors import OPDError, ResultLost
from kernel.spec import JobSpec
from tests.fakes import tinker as fake
from tests.support import named
from tests.worker.engine.backends.live import live_spec, one_tiny_step
from worker.engine.backends import connect
from worker.engine.rollouts.datums import build_opd_datum

PROMPT = list(b"<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
SAMPLE = SamplingParams(max_tokens=8, seed=1)
REQUEST = httpx.Request("POST", "https://tinker.example/api/v1/asample")


def spec(**tinker_options: Any) -> JobSpec:
    options = {"call_attempts": 2, "call_retry_delay_seconds": 0.001} | tinker_options
    return JobSpec.model_validate(named({"backend": "tinker", "tinker": options}))


def connected(monkeypatch: pytest.MonkeyPatch, service: fake.FakeServiceClient, **options: Any):
    fake.patch_tinker(monkeypatch, service)
    return connect(spec(**options), Path("unused"), lambda *_: None)


def drawn_datum(sequence: Any, advantage: float) -> Any:
    """The OPD datum of a drawn completion, every token with the same advantage."""
    tokens = sequence.tokens
    return build_opd_datum(PROMPT, tokens, sequence.logprobs, [advantage] * len(tokens))


def must_not_connect() -> None:
    pytest.fail("the tinker backend reached the network without credentials")


@pytest.fixture
def no_login(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No key in the environment and no `tinker auth login` profile."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("TINKER_API_KEY", "TINKER_CREDENTIAL_CMD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tinker, "ServiceClient", must_not_connect)


@pytest.mark.parametrize("key", [None, "sk-not-a-tinker-key"])
def test_missing_credentials_fail_before_any_network_call(monkeypatch, no_login, key) -> None:
    if key:
        monkeypatch.setenv("TINKER_API_KEY", key)

    with pytest.raises(OPDError) as caught:
        connect(spec(), Path("unused"), lambda *_: None)

    assert caught.value.code == "backend_auth"
    assert "TINKER_API_KEY" in str(caught.value) and "tinker auth login" in str(caught.value)


async def test_a_tinker_auth_login_profile_is_credentials(monkeypatch, no_login) -> None:
    store = JsonCredentialStore(default_credentials_path())
    store.add_key("work", ManualKey(key="tml-stored-key", name="work"))
    store.set_default("work")
    service = fake.FakeServiceClient()
    monkeypatch.setattr(tinker, "ServiceClient", lambda: service)

    backend = connect(spec(), Path("unused"), lambda *_: None)
    await backend.create_lora_training_client_async("tiny-student", rank=8)

    assert len(service.calls_named("create_model")) == 1


async def test_requests_reach_tinker_as_its_own_types(monkeypatch) -> None:
    service = fake.FakeServiceClient()
    backend = connected(monkeypatch, service)

    training = await backend.create_lora_training_client_async("tiny-student", rank=8, seed=3)
    sampler = await training.save_weights_and_get_sampling_client_async()
    params = SamplingParams(max_tokens=5, temperature=0.7, top_k=20, top_p=0.9, seed=4, stop=["."])
    drawn = await sampler.sample_async(ModelInput.from_ints(PROMPT), 3, params)
    sequence = drawn.sequences[0]
    datum = drawn_datum(sequence, advantage=0.5)
    config = {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}
    fwd_bwd = await training.forward_backward_async([datum], "ppo", config)
    optim = await training.optim_step_async(AdamParams(learning_rate=0.01, weight_decay=0.1))
    output = await fwd_bwd
    await optim
    saved = await (await training.save_state_async("state-1"))

    [create] = service.calls_named("create_model")
    assert (create.request.base_model, create.request.lora_config.rank) == ("tiny-student", 8)
    assert create.request.lora_config.seed == 3
    sample = next(c.request for c in service.calls_named("sample") if c.request.num_samples == 3)
    assert sample.sampling_params == tinker.SamplingParams(**params.model_dump())
    assert sample.prompt.to_ints() == PROMPT
    [sent] = service.calls_named("forward_backward")
    assert sent.request.forward_backward_input.loss_fn == "ppo"
    assert sent.request.forward_backward_input.loss_fn_config == config
    [sent_datum] = sent.request.forward_backward_input.data
    assert sent_datum.model_input.to_ints() == datum.model_input.to_ints()
    for name, tensor in datum.loss_fn_inputs.items():
        assert sent_datum.loss_fn_inputs[name].tolist() == tensor.data
        assert sent_datum.loss_fn_inputs[name].dtype == tensor.dtype
    [step] = service.calls_named("optim_step")
    assert step.request.optim_params == tinker.AdamParams(learning_rate=0.01, weight_decay=0.1)
    [save] = service.calls_named("save_state")
    assert (save.request.path, save.request.overwrite) == ("state-1", True)
    assert saved.path in service.checkpoints and saved.model == "tiny-student"
    assert len(drawn.sequences) == 3 and drawn.sequences[0].text is not None
    [logprobs] = output.loss_fn_outputs
    assert len(logprobs["logprobs"].data) == len(datum.model_input.to_ints())


async def test_trainer_metrics_are_named_as_pytrio_names_them(monkeypatch) -> None:
    service = fake.FakeServiceClient()
    training = await connected(monkeypatch, service).create_lora_training_client_async(
        "tiny-student", rank=8
    )
    sampler = await training.save_weights_and_get_sampling_client_async()
    [sequence] = (await sampler.sample_async(ModelInput.from_ints(PROMPT), 1, SAMPLE)).sequences
    datum = drawn_datum(sequence, advantage=1.0)

    output = await (await training.forward_backward_async([datum], "importance_sampling"))

    [sent] = service.calls_named("forward_backward")
    assert output.metrics == {"loss_sum": sent.result.metrics["loss:sum"]}


async def test_a_call_waits_at_most_call_timeout_seconds(monkeypatch) -> None:
    monkeypatch.setattr(
        fake.FakeSamplingClient, "sample", lambda *_, **__: AwaitableConcurrentFuture(Future())
    )
    backend = connected(
        monkeypatch, fake.FakeServiceClient(), call_timeout_seconds=1, call_attempts=1
    )
    teacher = await backend.create_sampling_client_async("tiny-teacher")

    with pytest.raises(OPDError) as caught:
        await teacher.sample_async(ModelInput.from_ints(PROMPT), 1, SAMPLE)

    assert caught.value.code == "backend_unavailable"
    assert "TimeoutError" in str(caught.value) and "tinker.call_attempts" in str(caught.value)


def status(error: type[tinker.APIStatusError], code: int | None = None) -> tinker.APIStatusError:
    return fake.refused(error, f"{error.__name__} from Tinker", status=code)


def failed_request(category: RequestErrorCategory) -> tinker.RequestFailedError:
    return tinker.RequestFailedError(f"Request failed ({category})", "request-1", category)


def invalid_input() -> pydantic.ValidationError:
    try:
        tinker.ModelInput.model_validate({"chunks": "not chunks"})
    except pydantic.ValidationError as error:
        return error
    raise AssertionError("Tinker's ModelInput took chunks that are not chunks")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (status(tinker.AuthenticationError), "backend_auth"),
        (status(tinker.PermissionDeniedError), "backend_auth"),
        (status(tinker.BadRequestError), "backend_rejected"),
        (status(tinker.BillingError), "backend_rejected"),
        (status(tinker.NotFoundError), "backend_rejected"),
        (status(tinker.ConflictError), "backend_rejected"),
        (status(tinker.UnprocessableEntityError), "backend_rejected"),
        (status(tinker.APIStatusError, 408), "backend_unavailable"),
        (status(tinker.RateLimitError), "backend_unavailable"),
        (status(tinker.InternalServerError, 500), "backend_unavailable"),
        (status(tinker.InternalServerError, 503), "backend_unavailable"),
        (tinker.APITimeoutError(REQUEST), "backend_unavailable"),
        (tinker.APIConnectionError(request=REQUEST), "backend_unavailable"),
        (failed_request(RequestErrorCategory.Server), "backend_unavailable"),
        (failed_request(RequestErrorCategory.User), "backend_rejected"),
        (failed_request(RequestErrorCategory.Unknown), "backend_rejected"),
        (tinker.TinkerError("The api_key JWT has expired."), "backend_rejected"),
        (invalid_input(), "backend_rejected"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value,
)
async def test_tinker_errors_get_the_service_codes(monkeypatch, error, code) -> None:
    tries = []

    def failing(*_: Any, **__: Any) -> tinker.APIFuture[Any]:
        tries.append(error)
        return fake.failed(error)

    monkeypatch.setattr(fake.FakeSamplingClient, "sample", failing)
    teacher = await connected(monkeypatch, fake.FakeServiceClient()).create_sampling_client_async(
        "tiny-teacher"
    )

    with pytest.raises(OPDError) as caught:
        await teacher.sample_async(ModelInput.from_ints(PROMPT), 1, SAMPLE)

    assert caught.value.code == code
    assert len(tries) == (2 if code == "backend_unavailable" else 1)
    assert caught.value.__cause__ is error
    if isinstance(error, tinker.BillingError):
        assert "billing" in str(caught.value)


async def test_a_training_call_that_failed_at_tinker_is_not_repeated(monkeypatch) -> None:
    """Tinker's SDK submits at once and reports a failure only with the result, which may
    come after the call took effect: the worker never sends it again."""
    sent = []

    def failing(self: Any, data: Any, *args: Any, **kwargs: Any) -> tinker.APIFuture[Any]:
        sent.append(data)
        return fake.failed(status(tinker.InternalServerError, 502))

    monkeypatch.setattr(fake.FakeTrainingClient, "forward_backward", failing)
    backend = connected(monkeypatch, fake.FakeServiceClient(), call_attempts=4)
    training = await backend.create_lora_training_client_async("tiny-student", rank=8)
    datum = build_opd_datum(PROMPT, [5, 6], [-1.0, -1.0], [1.0, 1.0])

    pending = await training.forward_backward_async([datum], "importance_sampling")
    with pytest.raises(OPDError, match="not repeated") as caught:
        await pending

    assert isinstance(caught.value, ResultLost) and caught.value.code == "backend_unavailable"
    assert len(sent) == 1


async def test_a_save_whose_answer_was_lost_is_saved_again(monkeypatch) -> None:
    """The save took effect, its answer did not arrive: the retry writes the same state
    again rather than failing on a name the run has; a second save of the name fails."""
    save_state = fake.FakeTrainingClient.save_state
    lost = []

    def answer_lost_once(self: Any, *args: Any, **kwargs: Any) -> tinker.APIFuture[Any]:
        saved = save_state(self, *args, **kwargs)
        if lost:
            return saved
        lost.append(saved.result())
        return fake.failed(tinker.APITimeoutError(REQUEST))

    monkeypatch.setattr(fake.FakeTrainingClient, "save_state", answer_lost_once)
    service = fake.FakeServiceClient()
    training = await connected(monkeypatch, service).create_lora_training_client_async(
        "tiny-student", rank=8
    )

    state = await (await training.save_state_async("state-1"))
    with pytest.raises(OPDError) as again:
        await (await training.save_state_async("state-1"))

    assert state.path == lost[0].path and state.path in service.checkpoints
    assert len(service.calls_named("save_state")) == 2
    assert again.value.code == "backend_rejected"


async def test_a_state_loads_only_before_training_and_into_the_same_model(monkeypatch) -> None:
    service = fake.FakeServiceClient()
    backend = connected(monkeypatch, service)
    first = await backend.create_lora_training_client_async("tiny-student", rank=8)
    state = await (await first.save_state_async("state-0"))
    datum = build_opd_datum(PROMPT, [5, 6], [-1.0, -1.0], [1.0, 1.0])
    await (await first.forward_backward_async([datum], "importance_sampling"))

    with pytest.raises(OPDError, match="before the first training call") as early:
        await first.load_state_with_optimizer_async(state.path)
    other_rank = await backend.create_lora_training_client_async("tiny-student", rank=4)
    with pytest.raises(OPDError, match="rank 8") as rank:
        await (await other_rank.load_state_with_optimizer_async(state.path))
    other_model = await backend.create_lora_training_client_async("tiny-teacher", rank=8)
    with pytest.raises(OPDError, match="tiny-student") as model:
        await (await other_model.load_state_with_optimizer_async(state.path))

    assert {early.value.code, rank.value.code, model.value.code} == {"backend_rejected"}
    [load] = service.calls_named("load_state")
    assert (load.request.path, load.request.optimizer) == (state.path, True)


SDK_CALLS = {
    fake.FakeServiceClient: (
        tinker.ServiceClient,
        [
            "create_lora_training_client",
            "create_training_client_from_state_with_optimizer",
            "create_training_client_from_state",
            "create_sampling_client",
        ],
    ),
    fake.FakeTrainingClient: (
        tinker.TrainingClient,
        [
            "get_tokenizer",
            "get_info",
            "forward_backward",
            "optim_step",
            "save_state",
            "save_weights_for_sampler",
            "save_weights_and_get_sampling_client",
            "create_sampling_client",
        ],
    ),
    fake.FakeSamplingClient: (
        tinker.SamplingClient,
        ["get_tokenizer", "sample", "compute_logprobs"],
    ),
}


@pytest.mark.parametrize("stand_in", list(SDK_CALLS), ids=lambda cls: cls.__name__)
def test_the_fake_takes_the_sdks_arguments(stand_in) -> None:
    """Each call the backend makes is one the SDK has, and the fake takes its arguments by
    the SDK's names, kinds and defaults (a subset of them)."""
    sdk, names = SDK_CALLS[stand_in]
    for name in names:
        real = inspect.signature(getattr(sdk, name)).parameters
        for param in inspect.signature(getattr(stand_in, name)).parameters.values():
            assert param.name in real, f"{sdk.__name__}.{name} takes no {param.name!r}"
            assert (param.kind, param.default) == (
                real[param.name].kind,
                real[param.name].default,
            ), f"{name}({param.name})"


def tinker_datum(logprobs: list[float]) -> tinker.Datum:
    tokens = PROMPT[:4]
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": np.asarray(PROMPT[1:5], dtype=np.int64),
            "logprobs": np.asarray(logprobs, dtype=np.float32),
            "advantages": np.ones(len(tokens), dtype=np.float32),
        },
    )


def trio_datum_sent_as_is(training: fake.FakeTrainingClient) -> Any:
    return training.forward_backward([build_opd_datum(PROMPT, [5], [-1.0], [1.0])], "ppo")


def save_twice(training: fake.FakeTrainingClient, name: str) -> Any:
    training.save_state(name).result()
    return training.save_state(name)


REFUSALS = {
    "a LoRA rank over the model's": (
        lambda service, training: service.create_lora_training_client("m", rank=33),
        tinker.BadRequestError,
    ),
    "a loss input of another length than the model input": (
        lambda service, training: training.forward_backward([tinker_datum([-1.0] * 3)], "ppo"),
        tinker.BadRequestError,
    ),
    "a loss outside Tinker's": (
        lambda service, training: training.forward_backward([tinker_datum([-1.0] * 4)], "dpo"),
        tinker.BadRequestError,
    ),
    "PyTRIO's datum instead of Tinker's (the SDK's wire encoder)": (
        lambda service, training: trio_datum_sent_as_is(training),
        ValueError,
    ),
    "PyTRIO's prompt instead of Tinker's (the SDK's SampleRequest)": (
        lambda service, training: (
            service.create_sampling_client(base_model="m")
            .result()
            .sample(ModelInput.from_ints(PROMPT), 1, tinker.SamplingParams(max_tokens=3))
        ),
        pydantic.ValidationError,
    ),
    "a sample without max_tokens": (
        lambda service, training: (
            service.create_sampling_client(base_model="m")
            .result()
            .sample(tinker.ModelInput.from_ints(PROMPT), 1, tinker.SamplingParams())
        ),
        tinker.BadRequestError,
    ),
    "a state name saved before in the run": (
        lambda service, training: save_twice(training, "again"),
        tinker.ConflictError,
    ),
    "a time to live under an hour": (
        lambda service, training: training.save_state("short", ttl_seconds=60),
        tinker.BadRequestError,
    ),
    "a state that was never saved": (
        lambda service, training: service.create_training_client_from_state_with_optimizer(
            "tinker://run-0/weights/never"
        ),
        tinker.NotFoundError,
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_the_fake_refuses_what_tinker_refuses(case) -> None:
    request, refusal = REFUSALS[case]
    service = fake.FakeServiceClient()
    training = service.create_lora_training_client("m", rank=8).result()

    with pytest.raises(refusal):
        request(service, training).result()


@pytest.mark.skipif(
    not os.environ.get("TINKER_API_KEY"), reason="live Tinker test: set TINKER_API_KEY to run it"
)
@pytest.mark.timeout(1800)
async def test_one_tiny_step_against_the_real_service(tmp_path) -> None:
    model = "Qwen/Qwen3-4B-Instruct-2507"
    student = {"base_model": model, "lora_rank": 8}
    spec = live_spec(backend="tinker", student=student, teacher={"base_model": model})

    result, sink = await one_tiny_step(spec, connect(spec, tmp_path, lambda *_: None))

    assert "trainer/loss_sum" in sink.steps[0]
    assert str(result.final_weights_path).startswith("tinker://")
