"""connect_trio: PyTRIO's configuration, the login check, and an opt-in live run."""

from __future__ import annotations

import os
import warnings

import pytest
import pytrio
from pytrio.client.training_batch import plan_training_batch
from pytrio.config.config import auth_state, configuration
from pytrio.errors.auth import AuthError
from pytrio.errors.base import PyTrioError
from pytrio.model.limits import TrainingLimits
from pytrio.types import Datum, ModelInput, TensorData

from kernel.errors import OPDError
from kernel.spec import TrioBackendSpec
from tests.fakes.trio import FakeServiceClient, patch_pytrio
from tests.support import REFERENCE_NAMES
from tests.worker.engine.backends.live import live_spec, one_tiny_step
from worker.engine.backends.trio import connect_trio


def must_not_connect() -> None:
    pytest.fail("connect_trio reached the network without credentials")


def test_timeouts_and_retries_reach_pytrio_configuration(monkeypatch) -> None:
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    options = TrioBackendSpec(
        request_timeout_seconds=123, sampling_timeout_seconds=456, retry_max_attempts=7
    )

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTRIO warns about (and ignores) unknown options
        client = connect_trio(options)

    assert client is fake
    assert configuration.request_timeout_seconds == 123
    assert configuration.sampling_timeout_seconds == 456
    assert configuration.retry_max_attempts == 7


def test_service_client_is_looked_up_when_connecting(monkeypatch) -> None:
    patch_pytrio(monkeypatch, FakeServiceClient())
    later = FakeServiceClient()
    monkeypatch.setattr(pytrio, "ServiceClient", lambda: later)

    assert connect_trio(TrioBackendSpec()) is later


def test_missing_credentials_fail_before_any_network_call(monkeypatch) -> None:
    patch_pytrio(monkeypatch, FakeServiceClient())
    monkeypatch.setattr(auth_state, "api_key", "")
    monkeypatch.setattr(pytrio, "ServiceClient", must_not_connect)

    with pytest.raises(OPDError) as caught:
        connect_trio(TrioBackendSpec())

    assert caught.value.code == "backend_auth"
    assert "PYTRIO_API_KEY" in str(caught.value)
    assert "trio login" in str(caught.value)


def test_unreadable_login_profile_is_an_auth_error(monkeypatch) -> None:
    patch_pytrio(monkeypatch, FakeServiceClient())
    broken = AuthError(
        "Invalid config file /home/x/.pytrio/config.toml: bad TOML", code="auth.invalid_config"
    )
    monkeypatch.setattr(auth_state, "config_error", broken)
    monkeypatch.setattr(pytrio, "ServiceClient", must_not_connect)

    with pytest.raises(OPDError, match=r"config\.toml") as caught:
        connect_trio(TrioBackendSpec())

    assert caught.value.code == "backend_auth"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (AuthError("Invalid API key", code="unauthorized"), "backend_auth"),
        (PyTrioError("Control unreachable", code="network.connect_failed"), "backend_error"),
    ],
)
def test_session_failures_carry_a_code(monkeypatch, error: PyTrioError, code: str) -> None:
    patch_pytrio(monkeypatch, FakeServiceClient())

    def refuse() -> None:
        raise error

    monkeypatch.setattr(pytrio, "ServiceClient", refuse)

    with pytest.raises(OPDError, match=error.message) as caught:
        connect_trio(TrioBackendSpec())

    assert caught.value.code == code


@pytest.mark.skipif(
    not os.environ.get("PYTRIO_API_KEY"), reason="live PyTRIO test: set PYTRIO_API_KEY to run it"
)
@pytest.mark.timeout(1800)
async def test_one_tiny_step_against_the_real_service() -> None:
    spec = live_spec(
        student={"lora_rank": 4}, teacher={"base_model": REFERENCE_NAMES["student"]["base_model"]}
    )

    await one_tiny_step(spec, connect_trio(spec.trio))


def test_pytrios_cross_entropy_takes_one_target_per_position() -> None:
    """Why the spec refuses every logit-level objective on trio: PyTRIO's own batch planner
    refuses the [N, k] targets and weights a teacher top-k would need."""
    two_d = {"data": [0] * 6, "shape": [3, 2]}
    datum = Datum(
        model_input=ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={
            "target_tokens": TensorData(dtype="int64", **two_d),
            "weights": TensorData(dtype="float32", **two_d),
        },
    )
    limits = TrainingLimits(max_batch_size=None, max_tokens_per_request=None, max_seq_len=None)
    with pytest.raises(ValueError, match=r"target_tokens must have shape \[3\]"):
        plan_training_batch(
            [datum],
            loss_fn="cross_entropy",
            auto_shift=False,
            limits=limits,
            tokenizer_vocab_size=10,
        )
