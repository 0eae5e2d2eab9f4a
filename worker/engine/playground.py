"""The playground: one prompt completed by a job's checkpoint and, when asked, by its
teacher and by the untrained student, each token with its logprob and (when the teacher
is asked) its reverse KL against the teacher, as the training loop measures it.

The prompt is rendered as the job rendered its training prompts (a question with its
`question_suffix`), or a chat as given; every model completes the same prompt tokens.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any, cast

from pytrio.types import ModelInput, SampleSequence, SamplingParams

from kernel.errors import OPDError
from kernel.playground import (
    Completion,
    ModelOutput,
    ModelRole,
    SampleAnswer,
    SampleTask,
    TopLogprob,
)
from kernel.spec import TeacherSpec
from worker.engine.backends.contract import SamplingClient
from worker.engine.datums import build_prompt
from worker.engine.loop import stop_sequences
from worker.engine.preflight import check_compatible
from worker.engine.rollouts import TOPK_SCORING, teacher_logprobs
from worker.engine.sampler_cache import Loaded, SamplerCache


def finite(value: float | None) -> float | None:
    """JSON has no infinity: a non-finite logprob or KL travels as null."""
    return value if value is not None and math.isfinite(value) else None


async def ranked(
    client: SamplingClient, tokens: list[int], k: int, tokenizer: Any
) -> tuple[list[float | None], list[list[TopLogprob] | None]]:
    """Each token's logprob and the k likeliest tokens at each position (null at the
    first), from one prefill of `tokens` (a one-token sample with the prompt's logprobs
    and their top k, as the teacher's top-k scoring asks for them)."""
    response = await client.sample_async(
        ModelInput.from_ints(tokens),
        num_samples=1,
        sampling_params=TOPK_SCORING,
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
        return_text=False,
    )
    if len(response.topk_prompt_logprobs) != len(tokens):
        raise OPDError(
            f"the backend gave top-{k} logprobs for {len(response.topk_prompt_logprobs)} of "
            f"{len(tokens)} positions",
            code="backend_failed",
        )
    tops = [
        None
        if top is None
        else [
            TopLogprob(token_id=token, token=tokenizer.decode([token]), logprob=finite(value))
            for token, value in top
        ]
        for top in response.topk_prompt_logprobs
    ]
    return [finite(value) for value in response.prompt_logprobs], [None, *tops[1:]]


def compared_teacher(task: SampleTask) -> tuple[str, TeacherSpec]:
    """The teacher a request compares with: the one it names, or the job's first."""
    teachers = task.spec.teacher_specs()
    name = task.request.teacher or next(iter(teachers))
    return name, teachers[name]


def render(task: SampleTask, tokenizer: Any) -> list[int]:
    """The prompt tokens every model completes, rendered as the compared teacher's dataset
    (the first routed to it, or the first) renders its prompts."""
    request, spec = task.request, task.spec
    name, _ = compared_teacher(task)
    shares = spec.dataset_shares()
    dataset = next((d for d in shares if spec.route_of(d) == name), shares[0])
    if request.prompt_token_ids is not None:
        return known_tokens(request.prompt_token_ids, tokenizer)
    try:
        if request.text is not None:
            return list(tokenizer.encode(request.text, add_special_tokens=True))
        if request.prompt is not None:
            return build_prompt(
                tokenizer, request.prompt, dataset.question_suffix, dataset.enable_thinking
            )
        assert request.messages is not None
        text = tokenizer.apply_chat_template(
            [message.model_dump() for message in request.messages],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=dataset.enable_thinking,
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    except ValueError as error:
        raise OPDError(f"cannot render the prompt: {error}", code="invalid_prompt") from error


def known_tokens(token_ids: list[int], tokenizer: Any) -> list[int]:
    """Token ids a model can read: each below the tokenizer's size."""
    size = len(tokenizer)
    beyond = [token for token in token_ids if token >= size]
    if beyond:
        raise OPDError(
            f"prompt_token_ids: {beyond[0]} is not a token id (the vocabulary has {size})",
            code="invalid_prompt",
        )
    return token_ids


def stopped(seq: SampleSequence, stops: Sequence[str], tokenizer: Any) -> SampleSequence:
    """The sequence with its text, cut at the first stop string the request gave: its
    tokens end with the one that completed it (the fewest whose text holds a stop)."""
    text = tokenizer.decode(seq.tokens, skip_special_tokens=True)

    def stop_in(decoded: str) -> int | None:
        found = [decoded.find(stop) for stop in stops if stop in decoded]
        return min(found) if found else None

    if stop_in(text) is None:
        return seq.model_copy(update={"text": text})
    low, high = 1, len(seq.tokens)
    while low < high:
        middle = (low + high) // 2
        if stop_in(tokenizer.decode(seq.tokens[:middle], skip_special_tokens=True)) is None:
            low = middle + 1
        else:
            high = middle
    kept = tokenizer.decode(seq.tokens[:low], skip_special_tokens=True)
    return SampleSequence(
        stop_reason="stop",
        tokens=seq.tokens[:low],
        logprobs=(seq.logprobs or [])[:low],
        text=kept[: stop_in(kept)],
    )


def weights_of(task: SampleTask, role: ModelRole) -> tuple[str, str | None]:
    """(base model, saved weights) of each model a request may ask for."""
    spec = task.spec
    if role == "teacher":
        _, teacher = compared_teacher(task)
        return teacher.base_model, teacher.weights()
    return spec.student.base_model, task.weights_path if role == "checkpoint" else None


async def complete(
    role: ModelRole,
    task: SampleTask,
    loaded: Loaded,
    prompt: list[int],
    params: SamplingParams,
    teacher: SamplingClient | None,
    tokenizer: Any,
) -> ModelOutput:
    """`n` completions by one model (none sampled for max_tokens 0); each scored by the
    teacher when it is given; the prompt's logprobs when asked for; with `top_logprobs`,
    the likeliest tokens at each (the prompt's from the prefill that gives its logprobs)."""
    request = task.request
    sequences = [SampleSequence(stop_reason="length", tokens=[], logprobs=[], text="")] * request.n
    if request.max_tokens > 0:
        response = await loaded.client.sample_async(
            ModelInput.from_ints(prompt), request.n, params, return_text=False
        )
        sequences = [stopped(seq, request.stop, tokenizer) for seq in response.sequences]
    k = request.top_logprobs
    ranks_prompt = request.prompt_logprobs and k > 0
    ranks_completions = request.max_tokens > 0 and k > 0
    rankings = await asyncio.gather(
        *([ranked(loaded.client, prompt, k, tokenizer)] if ranks_prompt else []),
        *(
            ranked(loaded.client, prompt + list(seq.tokens), k, tokenizer)
            for seq in (sequences if ranks_completions else [])
        ),
    )
    prompt_logprobs = prompt_top = None
    if ranks_prompt:
        (prompt_logprobs, prompt_top), *rankings = rankings
    elif request.prompt_logprobs:
        scored = await loaded.client.compute_logprobs_async(ModelInput.from_ints(prompt))
        prompt_logprobs = [finite(value) for value in scored]
    tops = [top[len(prompt) :] for _, top in rankings] or [None] * len(sequences)
    scores: Sequence[list[float] | None] = [None] * len(sequences)
    if teacher is not None:
        scores = await asyncio.gather(
            *(teacher_logprobs(teacher, prompt, list(seq.tokens)) for seq in sequences)
        )
    completions = []
    for seq, scored, top in zip(sequences, scores, tops, strict=True):
        logprobs = [float(value) for value in seq.logprobs or []]
        kl = None if scored is None else [a - b for a, b in zip(logprobs, scored, strict=True)]
        completions.append(
            Completion(
                text=seq.text,
                tokens=[tokenizer.decode([token]) for token in seq.tokens],
                token_ids=list(seq.tokens),
                logprobs=[finite(value) for value in logprobs],
                stop_reason=seq.stop_reason,
                teacher_logprobs=None if scored is None else [finite(v) for v in scored],
                reverse_kl=None if kl is None else [finite(v) for v in kl],
                top_logprobs=cast(list[list[TopLogprob]] | None, top),
            )
        )
    every_kl = [v for c in completions for v in c.reverse_kl or [] if v is not None]
    base_model, weights = weights_of(task, role)
    return ModelOutput(
        model=role,
        base_model=base_model,
        weights=weights,
        cached=loaded.cached,
        completions=completions,
        reverse_kl_mean=sum(every_kl) / len(every_kl) if every_kl else None,
        prompt_logprobs=prompt_logprobs,
        prompt_top_logprobs=prompt_top,
    )


async def answer(task: SampleTask, samplers: SamplerCache) -> SampleAnswer:
    """Complete the task's prompt with each model it asks for."""
    start = time.perf_counter()
    roles: list[ModelRole] = [task.request.model, *task.request.compare]
    clients = await asyncio.gather(
        *(samplers.get(task.spec, *weights_of(task, role)) for role in roles)
    )
    loaded = dict(zip(roles, clients, strict=True))
    tokenizer = await asyncio.to_thread(loaded[roles[0]].client.get_tokenizer)
    teacher = loaded["teacher"].client if "teacher" in loaded else None
    prompt = render(task, tokenizer)
    if teacher is not None and roles != ["teacher"]:
        student = next(loaded[role].client for role in roles if role != "teacher")
        check_compatible(
            await asyncio.to_thread(student.get_tokenizer),
            await asyncio.to_thread(teacher.get_tokenizer),
            task.spec.student.base_model,
            f"teacher {compared_teacher(task)[1].base_model!r}",
            [],
        )
    request = task.request
    params = SamplingParams(
        max_tokens=request.max_tokens,
        seed=request.seed,
        temperature=request.temperature,
        top_p=request.top_p,
        stop=stop_sequences(tokenizer),
    )
    outputs = await asyncio.gather(
        *(
            complete(
                role,
                task,
                loaded[role],
                prompt,
                params,
                None if role == "teacher" else teacher,
                tokenizer,
            )
            for role in roles
        )
    )
    return SampleAnswer(
        prompt=tokenizer.decode(prompt),
        prompt_tokens=len(prompt),
        prompt_token_ids=prompt,
        prompt_pieces=[tokenizer.decode([token]) for token in prompt]
        if request.prompt_logprobs
        else None,
        outputs=list(outputs),
        seconds=time.perf_counter() - start,
    )
