"""forward_kl over the teacher's top-k on Tinker, against the Tinker fake: the teacher's top k
comes with its score, the datums Tinker's cross_entropy gets carry it, the loss and gradient
the fake computes are the local backend's objective in float64, the reward trains in a second
pass before the optimizer step, the default objective sends what it always sent, and a
pipelined run resumes exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
import torch
from pytrio.types import ModelInput

from kernel.errors import OPDError
from kernel.spec import JobSpec, ObjectiveSpec
from tests.fakes import model
from tests.fakes import tinker as fake
from tests.fakes.sinks import RecordingSink
from tests.support import assert_close
from tests.worker.engine.reference import reference_run
from worker.engine.backends import connect
from worker.engine.backends.local.divergences import divergence
from worker.engine.data.prompts import Prompts
from worker.engine.loop.state import RunResult, SavedState
from worker.engine.loop.steps import run_loop
from worker.engine.rollouts.datums import build_opd_datum
from worker.engine.teachers.scoring import teacher_scores

PROMPTS = ["What is 1 + 1?", "Name a prime.", "Is 9 square?", "What is 2 * 5?", "Is 7 odd?"]
K, COEF = 4, 0.5
TOPK = {"kind": "forward_kl", "top_k": K, "tail": False}
TEACHER = fake.base_weights("tiny-teacher")


def make_spec(**loop: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": "tinker",
            "student": {"base_model": "tiny-student", "lora_rank": 8},
            "teacher": {"base_model": "tiny-teacher"},
            "dataset": {"source": "inline", "prompts": PROMPTS, "question_suffix": "Box it."},
            "sampling": {"max_tokens": 6},
            "optim": {"learning_rate": 1e-4},
            "loop": {"batch_size": 2, "group_size": 2, "kl_penalty_coef": COEF} | loop,
            "tinker": {"call_retry_delay_seconds": 0.001},
        }
    )


async def odd_answers_pass(completions: list[str], references: list[str]) -> list[bool]:
    """A grader whose verdict differs within groups."""
    return [len(text) % 2 == 1 for text in completions]


async def run(
    spec: JobSpec, service: fake.FakeServiceClient, monkeypatch, **kwargs: Any
) -> tuple[RecordingSink, RunResult]:
    fake.patch_tinker(monkeypatch, service)
    sink = RecordingSink()
    backend = connect(spec, Path("unused"), lambda *_: None)
    prompts = Prompts(PROMPTS, ["2"] * len(PROMPTS))
    return sink, await run_loop(spec, backend, prompts, sink, **kwargs)


def completions(service: fake.FakeServiceClient) -> dict[tuple[int, ...], tuple[list[int], Any]]:
    """Each completion the student sampled, by its datum's model input: (prompt, sequence)."""
    drawn = {}
    for call in service.calls_named("sample"):
        if call.weights != TEACHER:
            prompt = call.request.prompt.to_ints()
            for sequence in call.result.sequences:
                drawn[tuple(prompt + sequence.tokens[:-1])] = (prompt, sequence)
    return drawn


def steps_of(service: fake.FakeServiceClient) -> list[list[fake.Call]]:
    """The forward_backward calls before each optim_step."""
    steps, current = [], []
    for call in service.calls:
        if call.name == "forward_backward":
            current.append(call)
        elif call.name == "optim_step":
            steps.append(current)
            current = []
    return steps


def top_k(row: np.ndarray) -> list[int]:
    return sorted(range(len(row)), key=lambda token: -row[token])[:K]


def direct_loss(
    logits: torch.Tensor, data: list[Any], drawn: dict, bonus: dict[tuple[int, ...], float]
) -> tuple[torch.Tensor, float, float]:
    """The local backend's loss in float64, from the two models' bigram tables: per
    completion position, COEF times the forward KL over the teacher's top K (the local
    backend's own `divergence`) plus the importance-sampling loss of the reward's bonus,
    averaged; with the mean objective and the mean teacher mass kept."""
    teacher = torch.tensor(model.log_probs(TEACHER))
    student = logits.log_softmax(-1)
    losses, values, masses = [], [], []
    for datum in data:
        key = tuple(datum.model_input.to_ints())
        prompt, sequence = drawn[key]
        previous = torch.tensor(key[len(prompt) - 1 :])
        value, mass = divergence(student[previous], teacher[previous], ObjectiveSpec(**TOPK))
        chosen = student[previous, torch.tensor(sequence.tokens)]
        ratio = torch.exp(chosen - torch.tensor(sequence.logprobs, dtype=torch.float64))
        losses.append(COEF * value - ratio * bonus.get(key, 0.0))
        values.append(value.detach())
        masses.append(mass)
    return (
        torch.cat(losses).mean(),
        float(torch.cat(values).mean()),
        float(torch.cat(masses).mean()),
    )


def gradient_of(loss: torch.Tensor, logits: torch.Tensor) -> np.ndarray:
    loss.backward()
    assert logits.grad is not None
    return logits.grad.numpy()


async def test_the_teachers_top_k_comes_back_with_its_score_in_one_prefill(monkeypatch):
    service = fake.FakeServiceClient()
    fake.patch_tinker(monkeypatch, service)
    backend = connect(make_spec(objective=TOPK), Path("unused"), lambda *_: None)
    teacher = await backend.create_sampling_client_async("tiny-teacher")
    prompt, completion = list(b"Say 5:"), list(b" 5.")

    logprobs, topk = await teacher_scores(teacher, prompt, completion, K)
    wide = (await teacher_scores(teacher, prompt, completion, model.VOCAB + 3))[1]

    expected = await teacher.compute_logprobs_async(ModelInput.from_ints(prompt + completion))
    assert logprobs == expected[len(prompt) :]
    table = model.log_probs(TEACHER)
    tokens = prompt + completion
    for position, row in enumerate(topk, start=len(prompt)):
        previous = table[tokens[position - 1]]
        assert [token for token, _ in row] == top_k(previous)
        assert_close([v for _, v in row], previous[top_k(previous)], rtol=1e-6)
    assert all(len(row) == model.VOCAB + 3 and row[-1] == (0, -np.inf) for row in wide)
    [request, *_] = [c.request for c in service.calls_named("sample")]
    assert request.topk_prompt_logprobs == K and request.prompt_logprobs
    assert request.sampling_params.max_tokens == 1


async def test_a_forward_kl_job_trains_the_local_objective_over_the_teachers_top_k(monkeypatch):
    service = fake.FakeServiceClient()

    sink, _ = await run(make_spec(steps=2, objective=TOPK), service, monkeypatch)

    drawn = completions(service)
    teacher_calls = [c for c in service.calls_named("sample") if c.weights == TEACHER]
    assert len(teacher_calls) == len(drawn) == 2 * 2 * 2, "one teacher call per completion"
    assert {(c.request.topk_prompt_logprobs, c.request.prompt_logprobs) for c in teacher_calls} == {
        (K, True)
    }
    teacher = model.log_probs(TEACHER)
    for step, [call] in enumerate(steps_of(service)):
        data = call.request.forward_backward_input.data
        assert call.request.forward_backward_input.loss_fn == "cross_entropy"
        positions = sum(len(drawn[tuple(d.model_input.to_ints())][1].tokens) for d in data)
        for datum in data:
            tokens = datum.model_input.to_ints()
            prompt, _ = drawn[tuple(tokens)]
            assert set(datum.loss_fn_inputs) == {"target_tokens", "weights"}
            targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
            weights = datum.loss_fn_inputs["weights"].to_numpy()
            assert targets.shape == weights.shape == (len(tokens), K)
            first = len(prompt) - 1
            assert not targets[:first].any() and not weights[:first].any()
            for position in range(first, len(tokens)):
                kept = top_k(teacher[tokens[position]])
                assert targets[position].tolist() == kept
                probs = np.exp(teacher[tokens[position], kept])
                assert_close(weights[position], COEF * probs / positions, rtol=1e-6)

        logits = torch.tensor(model.log_probs(call.weights), requires_grad=True)
        loss, objective, mass = direct_loss(logits, data, drawn, {})
        assert_close(call.gradient, gradient_of(loss, logits), rtol=1e-5, what="gradient")
        metrics = sink.steps[step]
        assert metrics["opd/objective_mean"] == pytest.approx(objective, rel=1e-5)
        assert metrics["opd/teacher_mass_mean"] == pytest.approx(mass, rel=1e-5)
        assert metrics["trainer/loss_mean"] == pytest.approx(loss.item(), rel=1e-5)
        assert metrics["trainer/token_count"] == positions
        # Tinker's own loss: -sum w log q, the objective plus the kept tokens' entropy.
        entropy = 0.0
        for datum in data:
            w = datum.loss_fn_inputs["weights"].to_numpy().astype(np.float64)
            entropy -= float((w[w > 0] * np.log(w[w > 0] * positions / COEF)).sum())
        assert call.result.metrics["loss:sum"] == pytest.approx(loss.item() + entropy, rel=1e-5)
        kls = []
        for datum in data:
            key = tuple(datum.model_input.to_ints())
            prompt, sequence = drawn[key]
            scored = teacher[list(key[len(prompt) - 1 :]), sequence.tokens]
            kls.extend(np.subtract(sequence.logprobs, scored))
        assert metrics["opd/reverse_kl_mean"] == pytest.approx(np.mean(kls), rel=1e-5)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo"])
async def test_the_reward_trains_in_a_second_pass_before_the_optimizer_step(monkeypatch, loss_fn):
    """Its advantages divided by the completion positions, as the cross_entropy's weights:
    the two passes add up to the local backend's loss; a step whose bonuses are all 0
    (every answer of each prompt graded alike) needs no second pass."""
    service = fake.FakeServiceClient()
    spec = make_spec(steps=4, objective=TOPK, reward={"coef": 2.0}, loss_fn=loss_fn)

    sink, _ = await run(spec, service, monkeypatch, grade=odd_answers_pass)

    drawn = completions(service)
    rewarded = 0
    for step, [distill, *policy] in enumerate(steps_of(service)):
        data = distill.request.forward_backward_input.data
        groups: dict[tuple[int, ...], list[tuple[tuple[int, ...], float]]] = {}
        for datum in data:
            key = tuple(datum.model_input.to_ints())
            prompt, sequence = drawn[key]
            text = model.TOKENIZER.decode(sequence.tokens, skip_special_tokens=True)
            groups.setdefault(tuple(prompt), []).append((key, float(len(text) % 2 == 1)))
        bonus = {
            key: 2.0 * (reward - np.mean([r for _, r in group]))
            for group in groups.values()
            for key, reward in group
        }
        assert len(policy) == (1 if any(bonus.values()) else 0)
        gradient = distill.gradient
        if policy:
            rewarded += 1
            sent = policy[0].request.forward_backward_input
            assert sent.loss_fn == loss_fn and policy[0].weights == distill.weights
            positions = sum(len(drawn[key][1].tokens) for key in bonus)
            for datum, twin in zip(sent.data, data, strict=True):
                key = tuple(datum.model_input.to_ints())
                assert key == tuple(twin.model_input.to_ints())
                first = len(drawn[key][0]) - 1
                assert set(datum.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
                advantages = datum.loss_fn_inputs["advantages"].to_numpy()
                assert not advantages[:first].any()
                assert_close(advantages[first:], [bonus[key] / positions] * (len(key) - first))
            gradient = gradient + policy[0].gradient

        logits = torch.tensor(model.log_probs(distill.weights), requires_grad=True)
        loss, _, _ = direct_loss(logits, data, drawn, bonus)
        assert_close(gradient, gradient_of(loss, logits), rtol=1e-5, what="gradient")
        assert sink.steps[step]["trainer/loss_mean"] == pytest.approx(loss.item(), rel=1e-5)
    assert rewarded, "the grader should tell some group's answers apart"


async def test_the_default_objective_sends_what_the_reference_loop_sends(monkeypatch):
    spec = make_spec(steps=3)
    service, reference = fake.FakeServiceClient(), fake.FakeServiceClient()

    await run(spec, service, monkeypatch)
    fake.patch_tinker(monkeypatch, reference)
    await reference_run(spec, connect(spec, Path("unused"), lambda *_: None), PROMPTS)

    def sent(client: fake.FakeServiceClient) -> list[Any]:
        return [
            (
                c.request.forward_backward_input.loss_fn,
                [
                    (d.model_input.to_ints(), {k: v.tolist() for k, v in d.loss_fn_inputs.items()})
                    for d in c.request.forward_backward_input.data
                ],
            )
            for c in client.calls_named("forward_backward")
        ]

    assert sent(service) == sent(reference) and len(sent(service)) == 3

    def asked(client: fake.FakeServiceClient) -> list[str]:
        """Every sample request but its ordinal, in a stable order."""
        return sorted(
            c.request.model_dump_json(exclude={"seq_id"}) for c in client.calls_named("sample")
        )

    assert asked(service) == asked(reference)
    assert not any(c.request.topk_prompt_logprobs for c in service.calls_named("sample"))


@pytest.mark.parametrize("k", [1, 2])
async def test_a_pipelined_run_resumes_exactly(monkeypatch, k):
    spec = make_spec(steps=6, max_steps_off_policy=k, save_every=3, objective=TOPK)
    service = fake.FakeServiceClient()
    whole, _ = await run(spec, service, monkeypatch)
    saved = {(s, kind): path for s, kind, path in whole.checkpoints}
    samplers = {s: path for (s, kind), path in saved.items() if kind == "sampler"}

    resumed, _ = await run(
        spec, service, monkeypatch, resume=SavedState(saved[3, "state"], 3, samplers)
    )

    def trained(sink: RecordingSink) -> dict[int, dict[str, float]]:
        return {
            step: {k: v for k, v in metrics.items() if not k.startswith(("time/", "data/comp"))}
            for step, metrics in sink.steps.items()
        }

    assert sorted(resumed.steps) == [3, 4, 5]
    assert trained(resumed) == {s: m for s, m in trained(whole).items() if s >= 3}
    assert all(0 < m["opd/teacher_mass_mean"] <= 1 for m in whole.steps.values())
    finals = [p for _, kind, p in whole.checkpoints + resumed.checkpoints if kind == "final"]
    assert len({service.checkpoints[path].weights for path in finals}) == 1 < len(finals)


def weighted(teacher_topk: list | None = None) -> Any:
    prompt, completion = [1, 2, 3], [4, 5]
    return build_opd_datum(
        prompt, completion, [-1.0, -1.0], [0.0, 0.0], weighted=True, teacher_topk=teacher_topk
    )


@pytest.mark.parametrize(
    ("datum", "objective", "loss_fn", "says"),
    [
        (weighted(), ObjectiveSpec(**TOPK), "importance_sampling", "carries no teacher top-k"),
        (weighted([[(4, -0.1)], [(5, -0.2)]]), ObjectiveSpec(kind="reverse_kl"), "ppo", "only"),
        (weighted([[(4, -0.1)], [(5, -0.2)]]), ObjectiveSpec(**TOPK), "dro", "does not scale"),
    ],
)
async def test_what_tinker_cannot_train_exactly_is_refused_before_anything_is_sent(
    monkeypatch, datum, objective, loss_fn, says
):
    service = fake.FakeServiceClient()
    fake.patch_tinker(monkeypatch, service)
    backend = connect(make_spec(objective=TOPK), Path("unused"), lambda *_: None)
    training = await backend.create_lora_training_client_async("tiny-student", rank=8)

    with pytest.raises(OPDError, match=says) as refused:
        await training.forward_backward_logits_async([datum], [], objective, loss_fn=loss_fn)

    assert refused.value.code == "backend_rejected"
    assert not service.calls_named("forward_backward")


def test_the_fake_refuses_cross_entropy_weights_of_another_shape():
    service = fake.FakeServiceClient()
    training = service.create_lora_training_client("m", rank=8).result()
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={
            "target_tokens": np.zeros((3, 2), dtype=np.int64),
            "weights": np.zeros((3,), dtype=np.float32),
        },
    )
    with pytest.raises(tinker.BadRequestError, match="must both be"):
        training.forward_backward([datum], "cross_entropy").result()
