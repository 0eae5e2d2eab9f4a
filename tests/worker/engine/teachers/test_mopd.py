"""Several teachers and datasets against the PyTRIO fake: route and mixture scoring read
from the calls the fake records, the per-step shares, the reward term, the preflight's
refusals and an exact resume."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from kernel.playground import SampleRequest, SampleTask
from kernel.spec import EvalSpec, JobSpec
from tests.fakes import model
from tests.fakes import tinker as tinker_fake
from tests.fakes.sinks import RecordingSink
from tests.fakes.trio import FakeServiceClient, base_weights
from tests.support import assert_close
from worker.engine.backends import connect
from worker.engine.backends.local.presets import tiny_tokenizer
from worker.engine.data.mixing import step_counts
from worker.engine.data.prompts import Prompts
from worker.engine.loop.state import RunResult, SavedState
from worker.engine.loop.steps import run_loop
from worker.engine.playground import answer
from worker.engine.rollouts.sampler_cache import SamplerCache
from worker.engine.teachers.mixture import mixture_logprobs

ADD = ["What is 1 + 2?", "What is 4 + 4?", "What is 7 + 1?"]
MUL = ["What is 3 * 3?", "What is 2 * 6?"]
ANSWERS = {"add": ["3", "8", "8"], "mul": ["9", "12"]}
TEACHERS = {"add": "teacher/add", "mul": "teacher/mul"}


def make_spec(mixture: str = "route", **loop: Any) -> JobSpec:
    routed = mixture == "route"
    return JobSpec.model_validate(
        {
            "backend": "trio",
            "student": {"base_model": "student/model", "lora_rank": 8},
            "teachers": {
                "add": {"base_model": TEACHERS["add"], "weight": 1.0},
                "mul": {"base_model": TEACHERS["mul"], "weight": 3.0},
            },
            "datasets": [
                {
                    "name": name,
                    "source": "inline",
                    "prompts": prompts,
                    "question_suffix": f"{name}: box it.",
                    "weight": weight,
                    **({"teacher": name} if routed else {}),
                }
                for name, prompts, weight in (("add", ADD, 2.0), ("mul", MUL, 1.0))
            ],
            "teacher_mixture": mixture,
            "sampling": {"max_tokens": 6},
            "optim": {"learning_rate": 1e-4},
            "loop": {"batch_size": 3, "group_size": 2, **loop},
        }
    )


POOLS = {name: Prompts(prompts, ANSWERS[name]) for name, prompts in (("add", ADD), ("mul", MUL))}


async def run(
    spec: JobSpec, fake: FakeServiceClient, **kwargs: Any
) -> tuple[RecordingSink, RunResult]:
    sink = RecordingSink()
    result = await run_loop(spec, fake, POOLS, sink, **kwargs)
    return sink, result


def question_of(tokens: list[int]) -> tuple[str, str]:
    """(dataset, question) of a rendered prompt, read back from its text."""
    text = model.TOKENIZER.decode(tokens)
    for name, prompts in (("add", ADD), ("mul", MUL)):
        for question in prompts:
            if f"{question}\n\n{name}: box it." in text:
                return name, question
    raise AssertionError(f"no dataset's prompt in {text!r}")


def trained(sink: RecordingSink) -> dict[int, dict[str, float]]:
    return {
        step: {k: v for k, v in m.items() if not k.startswith("time/") and "per_second" not in k}
        for step, m in sink.steps.items()
    }


def test_each_dataset_takes_its_rounded_share_and_the_last_the_rest():
    assert step_counts(3, [2.0, 1.0]) == [2, 1]
    assert step_counts(8, [1.0, 1.0, 2.0]) == [2, 2, 4]
    assert step_counts(5, [1.0, 100.0]) == [1, 4]  # max(1, ...) for the small one
    # round(1.5) = 2 for the first would leave the last none: capped so each gets one.
    assert step_counts(4, [3.0, 3.0, 1.0, 1.0]) == [1, 1, 1, 1]
    assert step_counts(5, [3.0, 3.0, 1.0, 1.0]) == [2, 1, 1, 1]


async def test_route_scores_each_prompt_with_its_datasets_teacher_only():
    fake = FakeServiceClient()

    sink, _ = await run(make_spec(steps=3), fake)

    # What steps scored: the calls after the probe (one sample of each dataset's first
    # prompt, scored by every teacher) took its sample.
    first_step = next(
        i
        for i, c in enumerate(fake.calls)
        if c.name == "sample" and c.args["request"].num_samples == 2
    )
    scored = [c for c in fake.calls[first_step:] if c.name == "compute_logprobs"]
    by_teacher = {base_weights(model_name): name for name, model_name in TEACHERS.items()}
    seen: dict[str, set[str]] = {"add": set(), "mul": set()}
    for call in scored:
        dataset, question = question_of(call.args["request"].prompt.chunks[0].tokens)
        assert by_teacher[call.args["weights"]] == dataset, question
        seen[dataset].add(question)
    # 2 add + 1 mul prompts a step, in step order, each pool wrapping around.
    assert seen == {"add": set(ADD), "mul": set(MUL)}
    for step in range(3):
        assert sink.steps[step]["data/datums"] == 6
        assert sink.steps[step]["data/datums/add"] == 4
        assert sink.steps[step]["data/datums/mul"] == 2
        assert {"opd/reverse_kl_mean/add", "opd/reverse_kl_mean/mul"} <= sink.steps[step].keys()
        per_teacher = [sink.steps[step][f"usage/teacher_tokens/{t}"] for t in TEACHERS]
        assert sum(per_teacher) == sink.steps[step]["usage/teacher_tokens"]
    created = [c.args["base_model"] for c in fake.calls_named("create_sampling_client")]
    assert created == list(TEACHERS.values())
    probes = [data for _, message, data in sink.events if message.startswith("Probe reverse KL")]
    assert len(probes) == 1 and set(probes[0]["reverse_kl"]) == set(TEACHERS)


async def test_route_on_tinker_holds_a_sampler_per_teacher_and_routes_each_prompt(
    monkeypatch, tmp_path
):
    service = tinker_fake.FakeServiceClient()
    tinker_fake.patch_tinker(monkeypatch, service)
    spec = make_spec(steps=2).model_copy(update={"backend": "tinker"})

    sink, _ = await run(spec, connect(spec, tmp_path, lambda *_: None))

    made = [c.request.base_model for c in service.calls_named("create_sampler")]
    assert set(TEACHERS.values()) <= set(made)
    by_teacher = {tinker_fake.base_weights(m): name for name, m in TEACHERS.items()}
    samples = service.calls_named("sample")
    first_step = next(i for i, c in enumerate(samples) if c.request.num_samples == 2)
    scored = [c for c in samples[first_step:] if c.request.prompt_logprobs]
    assert scored
    for call in scored:
        dataset, _ = question_of(call.request.prompt.to_ints())
        assert by_teacher[call.weights] == dataset
    assert sink.steps[1]["data/datums/mul"] == 2


def test_mixture_logprobs_match_a_float64_reference():
    rng = np.random.default_rng(0)
    scored = rng.normal(-3.0, 2.0, size=(3, 50))
    weights = np.array([0.5, 2.0, 1.5])
    expected = np.log((weights[:, None] / weights.sum() * np.exp(scored)).sum(axis=0))

    mixed = mixture_logprobs([list(row) for row in scored], np.log(weights / weights.sum()))

    assert_close(np.array(mixed), expected, what="the mixture's logprobs")
    assert mixture_logprobs([[None, -1.0], [None, -2.0]], np.log([0.5, 0.5]))[0] is None


async def test_mixture_trains_toward_log_sum_of_weighted_teacher_probabilities():
    fake = FakeServiceClient()

    await run(make_spec("mixture", steps=2, kl_penalty_coef=1.0), fake)

    weights = np.log(np.array([1.0, 3.0]) / 4.0)
    teachers = [base_weights(TEACHERS["add"]), base_weights(TEACHERS["mul"])]
    got, expected = [], []
    for call in fake.calls_named("forward_backward"):
        for datum in call.args["data"]:
            tokens = datum.model_input.to_ints()
            targets = datum.loss_fn_inputs["target_tokens"].data
            start = next(i for i, t in enumerate(targets) if t)  # the completion's start
            sequence = [*tokens, targets[-1]]
            per_teacher = np.array([model.score(w, sequence)[start + 1 :] for w in teachers])
            mixture = np.logaddexp.reduce(weights[:, None] + per_teacher, axis=0)
            student = np.array(datum.loss_fn_inputs["logprobs"].data[start:])
            got += datum.loss_fn_inputs["advantages"].data[start:]
            expected += list(-(student - mixture))
    assert_close(got, expected, what="the mixture's advantages")
    # Every teacher scored every completion.
    scored = fake.calls_named("compute_logprobs")
    assert {c.args["weights"] for c in scored} == set(teachers)
    assert len(scored) % 2 == 0


async def test_an_evals_usage_counts_the_tokens_every_teacher_of_the_mixture_scored():
    fake = FakeServiceClient()
    spec = make_spec("mixture", steps=1).model_copy(
        update={"eval": EvalSpec(every=1, holdout=3, teacher_baseline=False)}
    )

    sink, _ = await run(spec, fake, eval_prompts=POOLS)

    # The last eval's calls follow the last optimizer step: each of its completions scored
    # by both teachers.
    last_step = max(i for i, c in enumerate(fake.calls) if c.name == "optim_step")
    scored = [c for c in fake.calls[last_step:] if c.name == "compute_logprobs"]
    assert {c.args["weights"] for c in scored} == {base_weights(t) for t in TEACHERS.values()}
    assert len(scored) == 2 * (len(ADD) + len(MUL))
    scored_tokens = sum(len(c.args["request"].prompt.chunks[0].tokens) for c in scored)
    metrics = sink.evals[1]
    sampled = metrics["eval/completion_tokens_mean"] * (len(ADD) + len(MUL))
    assert metrics["usage/eval_tokens"] == pytest.approx(scored_tokens + sampled)


async def test_reward_adds_coef_times_reward_minus_its_groups_mean_to_every_token():
    coef = 0.5

    async def grade(completions: list[str], references: list[str]) -> list[bool]:
        # A grader with a verdict that differs within groups: odd-length answers "pass".
        return [len(text) % 2 == 1 for text in completions]

    plain, rewarded = FakeServiceClient(), FakeServiceClient()
    await run(make_spec(steps=1), plain)
    sink, _ = await run(make_spec(steps=1, reward={"coef": coef}), rewarded, grade=grade)

    [base] = plain.calls_named("forward_backward")
    [call] = rewarded.calls_named("forward_backward")
    tokenizer = tiny_tokenizer()
    rewards, bonuses = [], []
    for before, after in zip(base.args["data"], call.args["data"], strict=True):
        targets = after.loss_fn_inputs["target_tokens"].data
        start = next(i for i, t in enumerate(targets) if t)
        text = tokenizer.decode(targets[start:], skip_special_tokens=True)
        rewards.append(float(len(text) % 2 == 1))
        gained = np.subtract(
            after.loss_fn_inputs["advantages"].data[start:],
            before.loss_fn_inputs["advantages"].data[start:],
        )
        assert np.ptp(gained) < 1e-6  # the same on every token
        bonuses.append(float(gained[0]))
    rewards_by_group = np.array(rewards).reshape(-1, 2)  # group_size 2, nothing empty here
    expected = coef * (rewards_by_group - rewards_by_group.mean(axis=1, keepdims=True))
    assert np.any(expected), "the grader should tell some group's answers apart"
    assert_close(bonuses, expected.ravel(), what="the reward term")
    assert sink.steps[0]["reward/mean"] == pytest.approx(np.mean(rewards))
    assert {"reward/mean/add", "reward/mean/mul"} <= sink.steps[0].keys()


def other_vocab() -> Any:
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<extra>"])
    return tokenizer


def other_eos() -> Any:
    tokenizer = tiny_tokenizer()
    tokenizer.eos_token = "<|endoftext|>"
    return tokenizer


@pytest.mark.parametrize("tokenizer", [other_vocab, other_eos])
async def test_a_teacher_with_another_tokenizer_is_named_cross_tokenizer(tokenizer):
    fake = FakeServiceClient(tokenizers={TEACHERS["mul"]: tokenizer()})

    sink, _ = await run(make_spec(steps=1), fake)

    modes = {e[2]["teacher"]: e[2]["mode"] for e in sink.events if e[2] and e[2].get("mode")}
    assert modes == {"add": "same", "mul": "cross"}
    assert "opd/aligned_bytes_fraction/mul" not in sink.steps[0], "one cross teacher"
    assert 0 < sink.steps[0]["opd/aligned_bytes_fraction"] <= 1


async def test_a_crashed_multi_teacher_run_resumes_exactly_with_k_1():
    spec = make_spec(steps=6, max_steps_off_policy=1, save_every=3)
    fake = FakeServiceClient()
    whole, _ = await run(spec, fake)
    saved = {(s, kind): path for s, kind, path in whole.checkpoints}
    samplers = {s: path for (s, kind), path in saved.items() if kind == "sampler"}

    resumed, _ = await run(spec, fake, resume=SavedState(saved[3, "state"], 3, samplers))

    assert trained(resumed) == {s: m for s, m in trained(whole).items() if s >= 3}
    [whole_final] = [p for _, kind, p in whole.checkpoints if kind == "final"]
    [resumed_final] = [p for _, kind, p in resumed.checkpoints if kind == "final"]
    assert fake.checkpoints[whole_final].weights == fake.checkpoints[resumed_final].weights


async def test_the_playground_compares_with_the_teacher_a_request_names(trained):
    teachers = {"main": {"base_model": "tiny-teacher"}, "other": {"base_model": "tiny-student"}}
    spec = trained.spec.model_dump(exclude={"teacher", "dataset"}) | {
        "teachers": teachers,
        "datasets": [
            trained.spec.dataset.model_dump() | {"name": name, "teacher": name} for name in teachers
        ],
    }
    spec["loop"]["batch_size"] = max(spec["loop"]["batch_size"], 2)
    cache = SamplerCache(lambda s: connect(s, trained.artifacts, lambda *_: None), 4, 2**30)

    for name, model_name in (("other", "tiny-student"), (None, "tiny-teacher")):
        task = SampleTask(
            request=SampleRequest(
                prompt="What is 2 + 3?", max_tokens=6, compare=["teacher"]
            ).model_copy(update={"teacher": name}),
            spec=JobSpec.model_validate(spec),
            weights_path=trained.final,
            deadline=time.time() + 60,
        )
        got = await answer(task, cache)
        [_, teacher] = got.outputs
        assert (teacher.model, teacher.base_model) == ("teacher", model_name)
        assert got.outputs[0].reverse_kl_mean is not None
