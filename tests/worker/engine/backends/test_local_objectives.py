"""The logit-level objectives of the local backend against float64 references written out
token by token, and their chunked gradients against one direct autograd pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pytrio.errors.base import ValidationError
from pytrio.types import Datum

from kernel.spec import LocalBackendSpec, ObjectiveSpec
from tests.support import assert_close
from worker.engine.backends.local import LocalServiceClient, LocalTrainingClient, distillation
from worker.engine.backends.local.divergences import divergence
from worker.engine.rollouts.datums import build_opd_datum

VOCAB = 11
VOCAB_OF_PRESETS = 259


def reference(student: np.ndarray, teacher: np.ndarray, spec: ObjectiveSpec) -> tuple[float, float]:
    """One position in float64, from probabilities: (the objective, the kept teacher mass)."""
    q, p = np.exp(student), np.exp(teacher)
    if spec.top_k:
        order = np.argsort(-(q if spec.kind == "reverse_kl" else p), kind="stable")
        keep = list(order[: spec.top_k])
        rest = [i for i in range(len(p)) if i not in keep]
        mass = float(sum(p[i] for i in keep))
        q = [q[i] for i in keep] + ([sum(q[i] for i in rest)] if spec.keeps_tail else [])
        p = [p[i] for i in keep] + ([sum(p[i] for i in rest)] if spec.keeps_tail else [])
    else:
        mass = 1.0

    def kl(a: list[float], b: list[float]) -> float:
        return sum(x * math.log(x / y) for x, y in zip(a, b, strict=True))

    q, p = list(q), list(p)
    if spec.kind == "reverse_kl":
        return kl(q, p), mass
    if spec.kind == "forward_kl":
        return kl(p, q), mass
    beta = spec.mixture_weight
    m = [beta * x + (1 - beta) * y for x, y in zip(p, q, strict=True)]
    return beta * kl(p, m) + (1 - beta) * kl(q, m), mass


OBJECTIVES = [
    ObjectiveSpec(kind="reverse_kl"),
    ObjectiveSpec(kind="forward_kl"),
    ObjectiveSpec(kind="jsd"),
    ObjectiveSpec(kind="jsd", beta=0.2),
    ObjectiveSpec(kind="reverse_kl", top_k=3),
    ObjectiveSpec(kind="reverse_kl", top_k=3, tail=False),
    ObjectiveSpec(kind="forward_kl", top_k=4),
    ObjectiveSpec(kind="forward_kl", top_k=4, tail=False),
    ObjectiveSpec(kind="jsd", beta=0.7, top_k=2),
]


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: f"{o.kind}-{o.top_k}-{o.tail}")
def test_each_objective_matches_its_float64_definition(objective):
    generator = torch.Generator().manual_seed(5)
    student = (3 * torch.randn(6, VOCAB, generator=generator)).log_softmax(-1)
    teacher = (3 * torch.randn(6, VOCAB, generator=generator)).log_softmax(-1)

    value, mass = divergence(student, teacher, objective)

    expected = [
        reference(s.double().numpy(), t.double().numpy(), objective)
        for s, t in zip(student, teacher, strict=True)
    ]
    assert_close(value, [v for v, _ in expected], rtol=1e-5, what="objective")
    assert_close(mass, [m for _, m in expected], rtol=1e-5, what="teacher mass")
    assert (value >= -1e-6).all()


def test_jsd_at_its_ends_is_forward_and_reverse_kl():
    generator = torch.Generator().manual_seed(2)
    student = torch.randn(4, VOCAB, generator=generator).log_softmax(-1)
    teacher = torch.randn(4, VOCAB, generator=generator).log_softmax(-1)
    for beta, kind in ((0.0, "forward_kl"), (1.0, "reverse_kl")):
        ends = divergence(student, teacher, ObjectiveSpec(kind="jsd", beta=beta))[0]
        assert torch.equal(ends, divergence(student, teacher, ObjectiveSpec(kind=kind))[0])


def test_a_top_k_as_large_as_the_vocabulary_is_the_full_distribution():
    student = torch.randn(3, VOCAB).log_softmax(-1)
    teacher = torch.randn(3, VOCAB).log_softmax(-1)
    full = divergence(student, teacher, ObjectiveSpec(kind="forward_kl"))
    assert torch.equal(
        full[0], divergence(student, teacher, ObjectiveSpec(kind="forward_kl", top_k=VOCAB))[0]
    )
    assert torch.equal(full[1], torch.ones(3))


@pytest.fixture
async def trainer(tmp_path) -> LocalTrainingClient:
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    return await service.create_lora_training_client_async("tiny-student", rank=8, seed=3)


@pytest.fixture
async def teachers(tmp_path) -> list:
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    return [
        await service.create_sampling_client_async("tiny-teacher"),
        await service.create_sampling_client_async("tiny-student"),
    ]


def completions(seed: int) -> list[tuple[list[int], list[int], Datum]]:
    """(prompt, completion, its datum) with a reward bonus as the advantage."""
    rng = np.random.default_rng(seed)
    out = []
    for prompt_length, length in ((5, 7), (3, 4), (6, 2)):
        prompt = rng.integers(0, 256, size=prompt_length).tolist()
        completion = rng.integers(0, 256, size=length).tolist()
        sampled = rng.uniform(-6, -1, size=length)
        bonus = np.full(length, rng.normal())
        out.append(
            (prompt, completion, build_opd_datum(prompt, completion, sampled, bonus, weighted=True))
        )
    return out


def gradients(trainer: LocalTrainingClient) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in trainer.trainable.items() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    return grads


def direct_loss(
    trainer: LocalTrainingClient, teachers: list, rows, mixture: list[float], objective, coef
) -> torch.Tensor:
    """The loss in one pass over full logits in float64: coef * objective + the
    importance-sampling loss of the bonus, per completion position, averaged."""
    losses = []
    for prompt, completion, datum in rows:
        ids = torch.tensor([prompt + completion[:-1]])
        first = len(prompt) - 1
        student = trainer.model(input_ids=ids).logits[0, first:].double().log_softmax(-1)
        with torch.no_grad():
            scored = [
                t.model(input_ids=ids).logits[0, first:].double().log_softmax(-1) for t in teachers
            ]
        teacher = torch.logsumexp(
            torch.stack([s + math.log(w) for s, w in zip(scored, mixture, strict=True)]), 0
        )
        value = divergence(student, teacher, objective)[0]
        sampled = torch.tensor(datum.loss_fn_inputs["logprobs"].data[first:], dtype=torch.float64)
        advantage = torch.tensor(
            datum.loss_fn_inputs["advantages"].data[first:], dtype=torch.float64
        )
        chosen = student.gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
        losses.append(coef * value - torch.exp(chosen - sampled) * advantage)
    return torch.cat(losses).mean()


@pytest.mark.parametrize(
    "objective",
    [
        ObjectiveSpec(kind="reverse_kl"),
        ObjectiveSpec(kind="forward_kl", top_k=5),
        ObjectiveSpec(kind="jsd", beta=0.3),
    ],
    ids=lambda o: o.kind,
)
async def test_the_chunked_gradient_is_the_direct_gradient(
    trainer, teachers, objective, monkeypatch
):
    """Three positions per chunk, against a mixture of two teachers and a reward bonus."""
    rows = completions(1)
    mixture = [0.75, 0.25]
    monkeypatch.setattr(distillation, "POSITION_BUDGET", 3 * VOCAB_OF_PRESETS)
    shares = [list(zip(teachers, mixture, strict=True))] * len(rows)
    output = await (
        await trainer.forward_backward_logits_async(
            [d for *_, d in rows], shares, objective, coef=0.5
        )
    )
    chunked = gradients(trainer)

    loss = direct_loss(trainer, teachers, rows, mixture, objective, coef=0.5)
    loss.backward()
    direct = gradients(trainer)

    assert chunked.keys() == direct.keys() and len(direct) > 10
    for name in direct:
        assert_close(chunked[name], direct[name], rtol=1e-4, what=name)
    assert_close(output.metrics["loss_mean"], loss.item(), rtol=1e-5)
    logprobs = output.loss_fn_outputs[0]["logprobs"].data
    assert len(logprobs) == len(rows[0][0]) + len(rows[0][1]) - 1
    assert logprobs[: len(rows[0][0]) - 1] == [0.0] * (len(rows[0][0]) - 1)


async def test_a_datum_without_completion_weights_is_refused(trainer, teachers):
    prompt, completion = [1, 2, 3], [4, 5]
    datum = build_opd_datum(prompt, completion, [-1.0, -1.0], [0.0, 0.0])
    with pytest.raises(ValidationError, match="weights"):
        await trainer.forward_backward_logits_async(
            [datum], [[(teachers[0], 1.0)]], ObjectiveSpec(kind="reverse_kl")
        )


async def test_a_teacher_over_another_vocabulary_is_refused(trainer, tmp_path):
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    other = await service.create_sampling_client_async("tiny-teacher")
    other.model.resize_token_embeddings(VOCAB_OF_PRESETS + 5)
    datum = build_opd_datum([1, 2], [3, 4], [-1.0, -1.0], [0.0, 0.0], weighted=True)
    with pytest.raises(ValidationError, match="vocabulary"):
        await trainer.forward_backward_logits_async(
            [datum], [[(other, 1.0)]], ObjectiveSpec(kind="forward_kl")
        )


def test_position_chunks_cover_every_position_within_the_budget():
    for count, vocab in ((0, 10), (1, 151_936), (1000, 151_936), (7, 2**25)):
        chunks = distillation.position_chunks(count, vocab)
        assert [i for c in chunks for i in range(c.start, c.stop)] == list(range(count))
        assert all(
            (c.stop - c.start) * vocab <= max(distillation.POSITION_BUDGET, vocab) for c in chunks
        )
