"""The playground's engine half on the local backend's tiny models: a trained checkpoint,
the teacher and the untrained student complete one prompt; every logprob is the model's
own, every reverse KL is the checkpoint's logprob minus the teacher's, as in training."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pytrio.types import ModelInput

from kernel.errors import OPDError
from kernel.model_names import ARITH_STUDENT, ARITH_TEACHER_BPE, ARITH_TEACHER_TEMPLATE
from kernel.playground import SampleRequest, SampleTask
from kernel.spec import JobSpec, LocalBackendSpec
from tests.support import assert_close
from tests.worker.engine.conftest import Trained
from worker.engine.backends import connect
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.presets import preset_tokenizer
from worker.engine.data.prompts import build_prompt
from worker.engine.playground import answer
from worker.engine.rollouts.sampler_cache import SamplerCache
from worker.engine.rollouts.sampling import stop_sequences
from worker.engine.teachers.cross_tokenizer import CROSS_TOP_K, Retokenized, Tokenizers

QUESTION = "What is 2 + 3?"


def cache_for(artifacts: Path) -> SamplerCache:
    return SamplerCache(lambda spec: connect(spec, artifacts, lambda *_: None), 4, 2**30)


def task(trained: Trained, **request: object) -> SampleTask:
    settings = {"prompt": QUESTION, "max_tokens": 12} | request
    return SampleTask(
        request=SampleRequest.model_validate(settings),
        spec=trained.spec,
        weights_path=trained.final,
        deadline=time.time() + 60,
    )


async def scores(trained, weights: str | None, base_model: str, prompt, tokens) -> list[float]:
    """Each token's logprob under a sampler of its own (not the playground's)."""
    service = connect(trained.spec, trained.artifacts, lambda *_: None)
    sampler = await service.create_sampling_client_async(base_model, model_path=weights)
    logprobs = await sampler.compute_logprobs_async(ModelInput.from_ints(prompt + tokens))
    return logprobs[len(prompt) :]


async def tokenizer_of(trained: Trained) -> Any:
    service = connect(trained.spec, trained.artifacts, lambda *_: None)
    return (
        await service.create_sampling_client_async(trained.spec.student.base_model)
    ).get_tokenizer()


async def test_each_model_completes_the_prompt_with_its_own_logprobs_and_the_kl(trained):
    spec, weights, artifacts = trained.spec, trained.final, trained.artifacts
    got = await answer(task(trained, n=2, compare=["teacher", "base"]), cache_for(artifacts))

    tokenizer = await tokenizer_of(trained)
    prompt = build_prompt(tokenizer, QUESTION, spec.dataset.question_suffix, False)
    assert got.prompt_tokens == len(prompt) and got.prompt == tokenizer.decode(prompt)
    assert [output.model for output in got.outputs] == ["checkpoint", "teacher", "base"]
    models = {
        "checkpoint": (weights, spec.student.base_model),
        "teacher": (None, spec.teacher.base_model),
        "base": (None, spec.student.base_model),
    }
    for output in got.outputs:
        assert len(output.completions) == 2 and not output.cached
        for completion in output.completions:
            tokens = completion.token_ids
            assert tokens and len(completion.tokens) == len(tokens) == len(completion.logprobs)
            own = await scores(trained, *models[output.model], prompt, tokens)
            assert_close(completion.logprobs, own, what=f"{output.model}'s own logprobs")
            if output.model == "teacher":
                assert completion.reverse_kl is None and completion.teacher_logprobs is None
                continue
            teacher = await scores(trained, None, spec.teacher.base_model, prompt, tokens)
            assert_close(completion.teacher_logprobs, teacher, what="the teacher's logprobs")
            assert_close(
                completion.reverse_kl,
                [a - b for a, b in zip(own, teacher, strict=True)],
                what="reverse KL = model - teacher",
            )
        if output.model != "teacher":
            every = [kl for c in output.completions for kl in c.reverse_kl]
            assert output.reverse_kl_mean == pytest.approx(sum(every) / len(every))
    # The checkpoint is the trained student, not its base: the two score its tokens apart.
    completion = got.outputs[0].completions[0]
    untrained = await scores(trained, None, spec.student.base_model, prompt, completion.token_ids)
    assert max(abs(a - b) for a, b in zip(untrained, completion.logprobs, strict=True)) > 1e-3


async def test_a_second_request_finds_the_models_loaded(trained):
    samplers = cache_for(trained.artifacts)
    first = await answer(task(trained, compare=["base"]), samplers)
    second = await answer(task(trained, compare=["base"]), samplers)
    with_teacher = await answer(task(trained, compare=["teacher", "base"]), samplers)

    assert [o.cached for o in first.outputs] == [False, False]
    assert [o.cached for o in second.outputs] == [True, True]
    assert first.outputs[0].completions[0].reverse_kl is None  # no teacher, no KL
    assert [o.cached for o in with_teacher.outputs] == [True, False, True], "none evicted"
    assert len(samplers.entries) == 3


async def test_a_chat_is_rendered_with_the_chat_template_as_given(trained):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": QUESTION},
    ]
    got = await answer(task(trained, prompt=None, messages=messages), cache_for(trained.artifacts))

    assert got.prompt == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


async def test_the_teacher_alone_completes_the_prompt_when_it_is_the_model_asked_for(trained):
    got = await answer(task(trained, model="teacher", n=2), cache_for(trained.artifacts))

    [output] = got.outputs
    assert output.model == "teacher" and output.base_model == trained.spec.teacher.base_model
    assert output.weights is None and output.reverse_kl_mean is None
    prompt = build_prompt(
        await tokenizer_of(trained), QUESTION, trained.spec.dataset.question_suffix, False
    )
    for completion in output.completions:
        own = await scores(
            trained, None, trained.spec.teacher.base_model, prompt, completion.token_ids
        )
        assert_close(completion.logprobs, own, what="the teacher's own logprobs")


async def test_a_stop_string_ends_the_text_before_it_and_the_tokens_with_it(trained):
    samplers = cache_for(trained.artifacts)
    whole = (await answer(task(trained, temperature=0, max_tokens=24), samplers)).outputs[0]
    text = whole.completions[0].text
    assert len(text) > 8, text
    stop = text[5:7]  # greedy decoding: the same completion again, until the stop
    cut = await answer(task(trained, temperature=0, max_tokens=24, stop=[stop]), samplers)
    [completion] = cut.outputs[0].completions

    assert completion.text == text[: text.find(stop)] and completion.stop_reason == "stop"
    kept = len(completion.token_ids)
    assert completion.token_ids == whole.completions[0].token_ids[:kept]
    tokenizer = await tokenizer_of(trained)
    assert stop in tokenizer.decode(completion.token_ids)
    assert stop not in tokenizer.decode(completion.token_ids[:-1])
    assert len(completion.logprobs) == kept


async def test_a_seed_is_the_samplers_seed(trained):
    """Two fresh samplers given one seed sample the same completions; another seed differs."""
    runs = [
        await answer(task(trained, seed=seed, max_tokens=24), cache_for(trained.artifacts))
        for seed in (7, 7, 8)
    ]
    ids = [run.outputs[0].completions[0].token_ids for run in runs]
    assert ids[0] == ids[1] != ids[2]


async def test_top_logprobs_rank_the_prompt_and_each_completion_by_the_full_distribution(trained):
    """The k likeliest tokens at every prompt and sampled position, likeliest first, as a
    full log-softmax of the model ranks them; the prompt's logprobs come from the same
    prefill (each chosen token's value is its ranked value when it is among the k)."""
    got = await answer(
        task(trained, top_logprobs=3, prompt_logprobs=True, n=2, max_tokens=6),
        cache_for(trained.artifacts),
    )
    service = connect(trained.spec, trained.artifacts, lambda *_: None)
    sampler = await service.create_sampling_client_async(
        trained.spec.student.base_model, model_path=trained.final
    )
    output, prompt = got.outputs[0], got.prompt_token_ids or []
    assert output.prompt_top_logprobs is not None and output.prompt_logprobs is not None
    assert output.prompt_top_logprobs[0] is None
    for completion in output.completions:
        ids = prompt + completion.token_ids
        model = sampler.inner  # the local sampler itself, past the retrying wrapper
        logits = model.forward(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
        assert completion.top_logprobs is not None
        tops = [*output.prompt_top_logprobs[1:], *completion.top_logprobs]
        assert len(tops) == len(ids) - 1
        for position, top in enumerate(tops):
            assert top is not None
            values, tokens = logits[position].topk(3)
            assert [t.token_id for t in top] == tokens.tolist()
            assert_close([t.logprob for t in top], values.tolist(), what=f"position {position}")
        for token, value, top in zip(
            prompt[1:], output.prompt_logprobs[1:], output.prompt_top_logprobs[1:], strict=True
        ):
            assert top is not None
            assert all(t.logprob == value for t in top if t.token_id == token)
    plain = await answer(task(trained, prompt_logprobs=True), cache_for(trained.artifacts))
    assert plain.outputs[0].prompt_top_logprobs is None
    assert plain.outputs[0].completions[0].top_logprobs is None
    assert_close(plain.outputs[0].prompt_logprobs[1:], output.prompt_logprobs[1:])


def arith_task(teacher: str, artifacts: Path, **request: object) -> SampleTask:
    """arith-student beside `teacher` on the CPU: the untrained student (`base`) is the
    model asked for, so no job needs to run first."""
    spec = JobSpec.model_validate(
        {
            "backend": "local",
            "local": {"device": "cpu"},
            "student": {"base_model": ARITH_STUDENT, "lora_rank": 4},
            "teacher": {"base_model": teacher},
            "dataset": {"source": "inline", "prompts": [QUESTION]},
        }
    )
    settings = {"prompt": QUESTION, "max_tokens": 10, "model": "base", "compare": ["teacher"]}
    return SampleTask(
        request=SampleRequest.model_validate(settings | request),
        spec=spec,
        weights_path=str(artifacts / "unused"),
        deadline=time.time() + 60,
    )


async def own_scores(service: Any, model: str, prompt: list[int], tokens: list[int]) -> list[float]:
    sampler = await service.create_sampling_client_async(model)
    logprobs = await sampler.compute_logprobs_async(ModelInput.from_ints(prompt + tokens))
    return logprobs[len(prompt) :]


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("kind", ["prompt", "messages"])
async def test_a_teacher_with_its_own_template_reads_its_own_rendering(tmp_path, kind):
    """arith-teacher-template: the teacher completes, and scores the student's completion
    after, the prompt as its own template renders it; scored after the student's rendering
    its logprobs would differ."""
    messages = [{"role": "user", "content": QUESTION}]
    request = {"prompt": None, "messages": messages} if kind == "messages" else {}
    asked = arith_task(ARITH_TEACHER_TEMPLATE, tmp_path, n=2, **request)
    got = await answer(asked, cache_for(tmp_path))

    students, theirs = preset_tokenizer(ARITH_STUDENT), preset_tokenizer(ARITH_TEACHER_TEMPLATE)
    suffix = asked.spec.dataset_shares()[0].question_suffix
    if kind == "messages":
        student_prompt, teacher_prompt = (
            chat_prompt(students, messages),
            chat_prompt(theirs, messages),
        )
    else:
        student_prompt = build_prompt(students, QUESTION, suffix, False)
        teacher_prompt = build_prompt(theirs, QUESTION, suffix, False)
    assert student_prompt != teacher_prompt
    base, teacher = got.outputs
    assert base.prompt_token_ids == got.prompt_token_ids == student_prompt
    assert teacher.prompt_token_ids == teacher_prompt and teacher.prompt_tokens == len(
        teacher_prompt
    )
    assert teacher.prompt == theirs.decode(teacher_prompt)
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    for completion in teacher.completions:
        own = await own_scores(
            service, ARITH_TEACHER_TEMPLATE, teacher_prompt, completion.token_ids
        )
        assert_close(completion.logprobs, own, what="the teacher's own logprobs")
    for completion in base.completions:
        tokens = completion.token_ids
        expected = await own_scores(service, ARITH_TEACHER_TEMPLATE, teacher_prompt, tokens)
        assert_close(completion.teacher_logprobs, expected, what="after the teacher's prompt")
        wrong = await own_scores(service, ARITH_TEACHER_TEMPLATE, student_prompt, tokens)
        assert max(abs(a - b) for a, b in zip(wrong, expected, strict=True)) > 1e-3
        assert completion.teacher_tokens_read == len(teacher_prompt) + len(tokens)
        assert completion.aligned_bytes_fraction is None


async def test_a_teacher_with_another_tokenizer_samples_and_scores_in_its_own_tokens(tmp_path):
    """arith-teacher-bpe: it completes its own rendering in its own tokens; the student's
    completions get its logprobs mapped onto their tokens, as training's scorer maps them."""
    asked = arith_task(ARITH_TEACHER_BPE, tmp_path, n=2, temperature=0.7)
    got = await answer(asked, cache_for(tmp_path))

    students, theirs = preset_tokenizer(ARITH_STUDENT), preset_tokenizer(ARITH_TEACHER_BPE)
    suffix = asked.spec.dataset_shares()[0].question_suffix
    student_prompt = build_prompt(students, QUESTION, suffix, False)
    teacher_prompt = build_prompt(theirs, QUESTION, suffix, False)
    base, teacher = got.outputs
    assert base.prompt_token_ids == student_prompt and teacher.prompt_token_ids == teacher_prompt
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    for completion in teacher.completions:
        tokens = completion.token_ids
        assert tokens and completion.text == theirs.decode(tokens, skip_special_tokens=True)
        assert completion.tokens == [theirs.decode([token]) for token in tokens]
        own = await own_scores(service, ARITH_TEACHER_BPE, teacher_prompt, tokens)
        assert_close(completion.logprobs, own, what="the teacher's own logprobs")
    client = await service.create_sampling_client_async(ARITH_TEACHER_BPE)
    tokenizers = Tokenizers.of(students, theirs, stop_sequences(students), CROSS_TOP_K)
    scorer = Retokenized("teacher", client, teacher_prompt, tokenizers)
    for completion in base.completions:
        tokens, logprobs = completion.token_ids, completion.logprobs
        scored = await scorer.score(tokens, logprobs)
        assert len(completion.teacher_logprobs) == len(tokens)
        assert_close(completion.teacher_logprobs, scored.logprobs, what="the mapped logprobs")
        assert_close(
            completion.reverse_kl,
            [a - b for a, b in zip(logprobs, scored.logprobs, strict=True)],
            what="reverse KL = student - mapped teacher",
        )
        aligned, total = scored.aligned_bytes["teacher"]
        assert completion.aligned_bytes_fraction == pytest.approx(aligned / total)
        assert completion.teacher_tokens_read == scored.teacher_tokens["teacher"]


async def test_each_model_tokenizes_a_text_and_token_ids_are_the_asked_models(tmp_path):
    samplers = cache_for(tmp_path)
    text = "What is 7 * 8?"
    got = await answer(arith_task(ARITH_TEACHER_BPE, tmp_path, prompt=None, text=text), samplers)
    students, theirs = preset_tokenizer(ARITH_STUDENT), preset_tokenizer(ARITH_TEACHER_BPE)
    assert [o.prompt_token_ids for o in got.outputs] == [
        students.encode(text, add_special_tokens=True),
        theirs.encode(text, add_special_tokens=True),
    ]

    ids = theirs.encode(text, add_special_tokens=False)
    with pytest.raises(OPDError, match="another tokenizer") as refused:
        await answer(
            arith_task(ARITH_TEACHER_BPE, tmp_path, prompt=None, prompt_token_ids=ids), samplers
        )
    assert refused.value.code == "invalid_prompt"
    alone = await answer(
        arith_task(
            ARITH_TEACHER_BPE,
            tmp_path,
            prompt=None,
            prompt_token_ids=ids,
            model="teacher",
            compare=[],
        ),
        samplers,
    )
    assert alone.prompt_token_ids == ids and alone.prompt == text
    beyond = [len(theirs)]
    with pytest.raises(OPDError, match="is not a token id"):
        await answer(
            arith_task(
                ARITH_TEACHER_BPE,
                tmp_path,
                prompt=None,
                prompt_token_ids=beyond,
                model="teacher",
                compare=[],
            ),
            samplers,
        )
    plain = students.encode(text, add_special_tokens=False)
    shared = await answer(
        arith_task(ARITH_TEACHER_TEMPLATE, tmp_path, prompt=None, prompt_token_ids=plain),
        samplers,
    )
    assert [o.prompt_token_ids for o in shared.outputs] == [plain, plain]
