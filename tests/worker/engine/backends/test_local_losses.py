"""The local backend's losses and gradients against direct reference computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pytrio.errors.base import ValidationError
from pytrio.types import AdamParams, Datum, ModelInput

from kernel.spec import LocalBackendSpec
from kernel.spec.loop import LOSS_OPTIONS, SamplerCorrectionSpec
from tests.support import assert_close
from worker.engine.backends.local import LocalServiceClient, LocalTrainingClient
from worker.engine.backends.local.losses import (
    cispo,
    dro,
    importance_sampling,
    ppo,
    sampler_gate,
)


@pytest.fixture
async def trainer(tmp_path) -> LocalTrainingClient:
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    return await service.create_lora_training_client_async("tiny-student", rank=8, seed=3)


def policy_datum(rng: np.random.Generator, length: int) -> Datum:
    tokens = rng.integers(0, 256, size=length + 1)
    return Datum(
        model_input=ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": tokens[1:].astype(np.int64),
            "logprobs": rng.uniform(-6, -1, size=length).astype(np.float32),
            "advantages": rng.normal(size=length).astype(np.float32),
        },
    )


def test_importance_sampling_is_minus_ratio_times_advantage():
    logprobs = torch.tensor([-1.0, -2.0], requires_grad=True)
    inputs = {"logprobs": torch.tensor([-1.5, -2.0]), "advantages": torch.tensor([2.0, -3.0])}
    loss = importance_sampling(logprobs, inputs, {}).sum()
    loss.backward()
    ratio = torch.exp(torch.tensor([0.5, 0.0]))
    assert_close(loss, -(ratio * inputs["advantages"]).sum())
    assert_close(logprobs.grad, -ratio * inputs["advantages"])


def test_ppo_clips_the_ratio_only_where_that_lowers_the_objective():
    logprobs = torch.log(torch.tensor([1.5, 1.5, 0.5, 1.1])).requires_grad_()
    inputs = {"logprobs": torch.zeros(4), "advantages": torch.tensor([1.0, -1.0, 1.0, 1.0])}
    losses = ppo(logprobs, inputs, LOSS_OPTIONS["ppo"])
    losses.sum().backward()
    assert_close(losses, [-1.2, 1.5, -0.5, -1.1])
    # Clipped (ratio 1.5, A > 0) has no gradient; the others get -ratio * A.
    assert_close(logprobs.grad, [0.0, 1.5, -0.5, -1.1])


def test_cispo_weighs_the_logprob_gradient_by_the_clipped_ratio():
    logprobs = torch.log(torch.tensor([6.0, 0.5])).requires_grad_()
    inputs = {"logprobs": torch.zeros(2), "advantages": torch.tensor([1.0, -2.0])}
    losses = cispo(logprobs, inputs, {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0})
    losses.sum().backward()
    # The ratio 6 is clipped to 4 but, unlike ppo, still passes a gradient: -4 * A.
    assert_close(logprobs.grad, [-4.0, 1.0])
    assert_close(losses, [-4.0 * np.log(6.0), np.log(0.5)])


def test_dro_adds_a_quadratic_penalty_on_the_log_ratio():
    logprobs = torch.tensor([-1.0, -3.0], requires_grad=True)
    inputs = {"logprobs": torch.tensor([-2.0, -3.0]), "advantages": torch.tensor([0.5, 1.0])}
    losses = dro(logprobs, inputs, {"beta": 0.2})
    losses.sum().backward()
    assert_close(losses, [0.5 + 0.1 * 1.0, 3.0])
    assert_close(logprobs.grad, [-0.5 + 0.2 * 1.0, -1.0])


def test_dro_leaves_positions_without_an_advantage_alone():
    """A prompt position's sampling logprob is a 0 placeholder: no penalty pulls towards it."""
    logprobs = torch.tensor([-2.0, -1.0], requires_grad=True)
    inputs = {"logprobs": torch.tensor([0.0, -2.0]), "advantages": torch.tensor([0.0, 0.5])}
    losses = dro(logprobs, inputs, {"beta": 0.2})
    losses.sum().backward()
    assert_close(losses, [0.0, 0.5 + 0.1 * 1.0])
    assert_close(logprobs.grad, [0.0, -0.5 + 0.2 * 1.0])


def reference_logprobs(trainer: LocalTrainingClient, datum: Datum) -> torch.Tensor:
    """One datum alone, no padding: log p(target_t | input_<=t)."""
    ids = torch.tensor([datum.model_input.to_ints()])
    targets = torch.tensor(datum.loss_fn_inputs["target_tokens"].data)
    logits = trainer.model(input_ids=ids).logits[0].double()
    return logits.log_softmax(-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)


def grads(trainer: LocalTrainingClient) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.trainable.items() if p.grad is not None}


async def train_once(trainer: LocalTrainingClient, data: list[Datum], loss_fn: str):
    """One forward_backward plus an optimizer step, so LoRA B is non-zero afterwards."""
    await (await trainer.forward_backward_async(data, loss_fn))
    await (await trainer.optim_step_async(AdamParams(learning_rate=1e-2)))


def reference_loss(loss_fn: str, new: torch.Tensor, old: torch.Tensor, adv: torch.Tensor):
    """PyTRIO's (Tinker's) definitions, written out in float64."""
    options = LOSS_OPTIONS[loss_fn]
    ratio = torch.exp(new - old)
    if loss_fn == "importance_sampling":
        return -(ratio * adv).sum()
    low, high = options.get("clip_low_threshold"), options.get("clip_high_threshold")
    if loss_fn == "ppo":
        return -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv).sum()
    if loss_fn == "cispo":
        return -(ratio.clamp(low, high).detach() * new * adv).sum()
    return -((new * adv - 0.5 * options["beta"] * (new - old) ** 2) * (adv != 0)).sum()


@pytest.mark.parametrize("loss_fn", list(LOSS_OPTIONS))
async def test_forward_backward_matches_pytrio_s_definitions_and_normalisation(trainer, loss_fn):
    rng = np.random.default_rng(0)
    data = [policy_datum(rng, n) for n in (5, 9, 3)]
    data[2].loss_fn_inputs["advantages"].data[:2] = [0.0, 0.0]
    await train_once(trainer, data, "importance_sampling")

    out = await (await trainer.forward_backward_async(data, loss_fn, LOSS_OPTIONS[loss_fn]))
    backend_grads = grads(trainer)
    for param in trainer.trainable.values():
        param.grad = None

    total = torch.zeros((), dtype=torch.float64)
    for datum, output in zip(data, out.loss_fn_outputs, strict=True):
        new = reference_logprobs(trainer, datum)
        old, adv = (
            torch.tensor(datum.loss_fn_inputs[k].data, dtype=torch.float64)
            for k in ("logprobs", "advantages")
        )
        total = total + reference_loss(loss_fn, new, old, adv)
        assert_close(output["logprobs"].data, new, what="logprobs")
    # PyTRIO's trainer divides by the batch's active tokens (advantage tokens for dro).
    denominator = 15 if loss_fn == "dro" else 17
    (total / denominator).backward()

    assert out.metrics["loss_sum"] == pytest.approx(total.item(), rel=1e-5, abs=1e-5)
    assert out.metrics["token_count"] == 17
    assert out.metrics["loss_mean"] == pytest.approx(out.metrics["loss_sum"] / 17)
    assert backend_grads.keys() == grads(trainer).keys() and backend_grads
    for name, grad in grads(trainer).items():
        assert_close(backend_grads[name], grad, rtol=1e-4, what=name)


@pytest.mark.parametrize("kind", ["mask", "truncate"])
async def test_a_sampler_correction_gates_each_token_by_its_ratio_in_the_same_pass(trainer, kind):
    """Masked: a token whose trainer/sampler ratio r is outside [1/c, c] adds nothing;
    truncated: its importance-sampling term is -clip(r, 1/c, c) * A in value and gradient.
    Tokens with no advantage keep their weight whatever their placeholder logprob."""
    rng = np.random.default_rng(1)
    data = [policy_datum(rng, n) for n in (7, 4)]
    data[1].loss_fn_inputs["advantages"].data[:1] = [0.0]
    await train_once(trainer, data, "importance_sampling")
    correction = SamplerCorrectionSpec(kind=kind, c=3.0)

    out = await (
        await trainer.forward_backward_async(data, "importance_sampling", correction=correction)
    )
    backend_grads = grads(trainer)
    for param in trainer.trainable.values():
        param.grad = None

    total, outside = torch.zeros((), dtype=torch.float64), 0
    for datum in data:
        new = reference_logprobs(trainer, datum)
        old, adv = (
            torch.tensor(datum.loss_fn_inputs[k].data, dtype=torch.float64)
            for k in ("logprobs", "advantages")
        )
        ratio = torch.exp(new - old).detach()
        kept = (ratio >= 1 / 3) & (ratio <= 3)
        outside += int((~kept & (adv != 0)).sum())
        weight = kept.double() if kind == "mask" else ratio.clamp(1 / 3, 3) / ratio
        total = total - (torch.exp(new - old) * weight * adv).sum()
    assert 0 < outside < 11  # some tokens of each kind
    (total / 11).backward()

    assert out.metrics["loss_sum"] == pytest.approx(total.item(), rel=1e-5, abs=1e-5)
    for name, grad in grads(trainer).items():
        assert_close(backend_grads[name], grad, rtol=1e-4, what=name)


def test_the_sampler_gate_leaves_tokens_without_an_advantage_alone():
    logprobs = torch.tensor([-0.1, -5.0, -1.0])
    inputs = {"logprobs": torch.tensor([0.0, -1.0, -1.2]), "advantages": torch.tensor([0.0, 1, 1])}
    assert sampler_gate(logprobs, inputs, "mask", 2.0).tolist() == [1.0, 0.0, 1.0]
    truncated = sampler_gate(logprobs, inputs, "truncate", 2.0)
    assert_close(truncated, torch.tensor([1.0, 0.5 / math.exp(-4.0), 1.0]))


async def test_ignored_targets_do_not_count(trainer):
    rng = np.random.default_rng(1)
    datum = policy_datum(rng, 6)
    masked = datum.model_copy(deep=True)
    masked.loss_fn_inputs["target_tokens"].data[:3] = [-100] * 3
    tail = datum.model_copy(deep=True)
    tail.loss_fn_inputs["advantages"].data[:3] = [0.0] * 3

    out_masked = await (await trainer.forward_backward_async([masked], "importance_sampling"))
    out_tail = await (await trainer.forward_backward_async([tail], "importance_sampling"))
    assert out_masked.metrics["token_count"] == 3
    assert out_masked.metrics["loss_sum"] == pytest.approx(out_tail.metrics["loss_sum"])


async def test_the_gradients_of_calls_add_up_until_the_optimizer_step(trainer):
    """Each call is normalised by its own batch, as PyTRIO normalises each logical batch."""
    rng = np.random.default_rng(2)
    data = [policy_datum(rng, 4), policy_datum(rng, 7)]
    await train_once(trainer, data, "importance_sampling")
    alone = []
    for part in (data[:1], data[1:]):
        await (await trainer.forward_backward_async(part, "importance_sampling"))
        alone.append(grads(trainer))
        for param in trainer.trainable.values():
            param.grad = None
    for part in (data[:1], data[1:]):
        await (await trainer.forward_backward_async(part, "importance_sampling"))
    for name, grad in grads(trainer).items():
        assert_close(grad, alone[0][name] + alone[1][name], what=name)
    await (await trainer.optim_step_async(AdamParams(learning_rate=1e-3)))
    assert not grads(trainer)


async def test_optim_step_is_adamw_with_each_calls_parameters(trainer):
    rng = np.random.default_rng(3)
    data = [policy_datum(rng, 8), policy_datum(rng, 5)]
    reference = {n: p.detach().clone().requires_grad_() for n, p in trainer.trainable.items()}
    optimizer = torch.optim.AdamW(reference.values())
    calls = [
        AdamParams(
            learning_rate=1e-2, beta1=0.8, beta2=0.9, eps=1e-8, weight_decay=0.1, grad_clip_norm=0.5
        ),
        AdamParams(learning_rate=3e-3, beta1=0.5, beta2=0.99, eps=1e-6, weight_decay=0.0),
    ]
    for adam in calls:
        await (await trainer.forward_backward_async(data, "importance_sampling"))
        for name, param in reference.items():
            param.grad = trainer.trainable[name].grad.clone()
        for group in optimizer.param_groups:
            group.update(
                lr=adam.learning_rate,
                betas=(adam.beta1, adam.beta2),
                eps=adam.eps,
                weight_decay=adam.weight_decay,
            )
        norm = torch.nn.utils.clip_grad_norm_(
            reference.values(), adam.grad_clip_norm or float("inf")
        )
        optimizer.step()
        step = await (await trainer.optim_step_async(adam))
        assert step.metrics["grad_norm"] == pytest.approx(norm.item())
        for name, param in trainer.trainable.items():
            assert torch.equal(param, reference[name]), name
    assert trainer.steps == 2


async def test_bad_datums_fail_as_pytrio_fails(trainer):
    rng = np.random.default_rng(4)
    datum = policy_datum(rng, 5)
    short = datum.model_copy(deep=True)
    short.loss_fn_inputs["advantages"].data = [0.0] * 4
    short.loss_fn_inputs["advantages"].shape = [4]
    with pytest.raises(ValueError, match=r"advantages must have shape \[5\]"):
        await trainer.forward_backward_async([short], "importance_sampling")
    out_of_vocab = datum.model_copy(deep=True)
    out_of_vocab.loss_fn_inputs["target_tokens"].data[0] = 10_000
    with pytest.raises(ValidationError, match="outside the tokenizer vocabulary"):
        await trainer.forward_backward_async([out_of_vocab], "importance_sampling")
    with pytest.raises(ValidationError, match="implements the losses"):
        await trainer.forward_backward_async([datum], "cross_entropy")
    with pytest.raises(ValidationError, match="beta do not apply to ppo"):
        await trainer.forward_backward_async([datum], "ppo", {"beta": 0.1})
