"""The playground: one prompt completed by a job's checkpoint and, when asked, by its
teacher and by the untrained student, each token with its logprob and (when the teacher
is asked) its reverse KL against the teacher, as the training loop measures it.

Each model reads the prompt as its own tokenizer renders it, as training renders each
teacher's prompts: a question as the job rendered its training prompts (its
`question_suffix`) and a chat (its tools, calls and replies too) as a training
conversation is rendered, by the same renderer (`teachers.Renderer`), with its own chat
template; a text tokenized by its own tokenizer; token ids as given. The teacher scores the
student's completion as training scores it (`teachers.TeacherView`): after its own prompt,
the completion's tokens or, with another tokenizer, their text as its own tokens, its
logprobs mapped onto the student's by byte offsets (`cross_tokenizer.Retokenized`). A self
teacher (`teacher.self`) reads its context first, as training renders it: its system line
and example turns where the template puts a system line, and the request's `reference`
after the last user turn if it reads one; its output's `prompt` is that context, beside
the student's own.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from jinja2 import TemplateError
from pytrio.types import ModelInput, SampleSequence, SamplingParams

from kernel.errors import OPDError
from kernel.playground import (
    Completion,
    ModelOutput,
    ModelRole,
    SampleAnswer,
    SampleTask,
    TopLogprob,
    missing_reference,
)
from kernel.spec import TeacherSpec
from kernel.spec.teachers import SelfTeacher
from worker.engine.backends.contract import SamplingClient
from worker.engine.rollouts.sampler_cache import Loaded, SamplerCache
from worker.engine.rollouts.sampling import Scored, Scorer, stop_sequences
from worker.engine.teachers.cross_tokenizer import Retokenized, Tokenizers, top_k_of
from worker.engine.teachers.preflight import tokenizer_difference
from worker.engine.teachers.scoring import TOPK_SCORING, Prompted
from worker.engine.teachers.views import Renderer


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


def render(task: SampleTask, tokenizer: Any, context: SelfTeacher | None = None) -> list[int]:
    """The prompt tokens a model with `tokenizer` completes: its own rendering of a
    question or a chat, by training's own renderer (its chat template, as the compared
    teacher's dataset, the first routed to it or the first, renders its prompts; after a
    self teacher's `context`), its own tokens of a text, or the token ids as given."""
    request, spec = task.request, task.spec
    name, _ = compared_teacher(task)
    shares = spec.dataset_shares()
    dataset = next((d for d in shares if spec.route_of(d) == name), shares[0])
    if request.prompt_token_ids is not None:
        return known_tokens(request.prompt_token_ids, tokenizer)
    try:
        if request.text is not None:
            return list(tokenizer.encode(request.text, add_special_tokens=True))
        prompt = request.prompt if request.prompt is not None else request.conversation()
        assert prompt is not None
        return Renderer(tokenizer, context)(prompt, dataset, request.reference)
    except (ValueError, TemplateError) as error:
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
    """(base model, saved weights) of each model a request may ask for: a self teacher's
    are the student's base (`base`) or the checkpoint asked for (`current`)."""
    spec = task.spec
    if role == "teacher":
        _, teacher = compared_teacher(task)
        if teacher.self is not None and teacher.self.weights == "current":
            return spec.student.base_model, task.weights_path
        return teacher.base_model, teacher.weights()
    return spec.student.base_model, task.weights_path if role == "checkpoint" else None


@dataclass(frozen=True)
class Reader:
    """One model of a request: its sampler, its tokenizer, and the prompt as that
    tokenizer renders it."""

    role: ModelRole
    loaded: Loaded
    tokenizer: Any
    prompt: list[int]


def own_stops(tokenizer: Any) -> list[str]:
    """The stop strings a model samples with: the student's (`stop_sequences`) that are
    tokens of its own, so a teacher with another tokenizer ends at its own end of sequence."""
    vocab = tokenizer.get_vocab()
    return [stop for stop in stop_sequences(tokenizer) if stop in vocab]


def readers(task: SampleTask, loaded: Sequence[Loaded], tokenizers: Sequence[Any]) -> list[Reader]:
    """Each model asked for with its own rendering of the prompt. Token ids are the model
    asked for's (`model`): a compared model with another tokenizer would read other text
    in them, so they are refused for it."""
    request = task.request
    roles: list[ModelRole] = [request.model, *request.compare]
    asked = tokenizers[0]
    if request.prompt_token_ids is not None:
        for role, tokenizer in zip(roles[1:], tokenizers[1:], strict=True):
            if not alike(asked, tokenizer):
                raise OPDError(
                    f"prompt_token_ids are ids of the {request.model}'s tokenizer, and the "
                    f"{role} ({weights_of(task, role)[0]!r}) has another tokenizer, which reads "
                    "other text in them: give the prompt as text (or prompt, messages), which "
                    "each model tokenizes with its own tokenizer",
                    code="invalid_prompt",
                )
    context = compared_teacher(task)[1].self
    return [
        Reader(
            role, one, tokenizer, render(task, tokenizer, context if role == "teacher" else None)
        )
        for role, one, tokenizer in zip(roles, loaded, tokenizers, strict=True)
    ]


@functools.lru_cache(maxsize=8)
def alike(one: Any, other: Any) -> bool:
    """Whether two tokenizers read every id alike (`preflight.tokenizer_difference`), kept
    for the pairs of models the sampler cache holds (not compared again per request)."""
    return tokenizer_difference(one, other) is None


@functools.lru_cache(maxsize=4)
def tokenizers_of(student: Any, teacher: Any, top_k: int) -> Tokenizers:
    """Both tokenizers as bytes, kept for the pairs of models the sampler cache holds (a
    vocabulary is read once, not per request)."""
    return Tokenizers.of(student, teacher, stop_sequences(student), top_k)


def teacher_scorer(task: SampleTask, student: Reader, teacher: Reader) -> Scorer:
    """The teacher scoring the student's completions as training scores them: after its
    own rendering of the prompt, the completion's tokens, or with another tokenizer their
    text as its own tokens, its logprobs mapped onto the student's (`Retokenized`)."""
    name, _ = compared_teacher(task)
    client = teacher.loaded.client
    if alike(student.tokenizer, teacher.tokenizer):
        return Prompted(name, client, teacher.prompt)
    tokenizers = tokenizers_of(student.tokenizer, teacher.tokenizer, top_k_of(client))
    return Retokenized(name, client, teacher.prompt, tokenizers)


def aligned_fraction(scored: Scored) -> float | None:
    """The fraction of a completion's bytes a teacher with another tokenizer aligned."""
    aligned, total = next(iter(scored.aligned_bytes.values()), (0, 0))
    return aligned / total if total else None


async def complete(task: SampleTask, reader: Reader, scorer: Scorer | None) -> ModelOutput:
    """`n` completions of the reader's own prompt (none sampled for max_tokens 0); each
    scored by the teacher when it is given; the prompt's logprobs when asked for; with
    `top_logprobs`, the likeliest tokens at each (the prompt's from the prefill that
    gives its logprobs)."""
    request = task.request
    loaded, tokenizer, prompt = reader.loaded, reader.tokenizer, reader.prompt
    sequences = [SampleSequence(stop_reason="length", tokens=[], logprobs=[], text="")] * request.n
    if request.max_tokens > 0:
        params = SamplingParams(
            max_tokens=request.max_tokens,
            seed=request.seed,
            temperature=request.temperature,
            top_p=request.top_p,
            stop=own_stops(tokenizer),
        )
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
    scores: Sequence[Scored | None] = [None] * len(sequences)
    if scorer is not None:
        scores = await asyncio.gather(
            *(
                scorer.score(list(seq.tokens), [float(v) for v in seq.logprobs or []])
                for seq in sequences
            )
        )
    completions = []
    for seq, scored, top in zip(sequences, scores, tops, strict=True):
        logprobs = [float(value) for value in seq.logprobs or []]
        teacher = None if scored is None else scored.logprobs
        kl = None if teacher is None else [a - b for a, b in zip(logprobs, teacher, strict=True)]
        completions.append(
            Completion(
                text=seq.text,
                tokens=[tokenizer.decode([token]) for token in seq.tokens],
                token_ids=list(seq.tokens),
                logprobs=[finite(value) for value in logprobs],
                stop_reason=seq.stop_reason,
                teacher_logprobs=None if teacher is None else [finite(v) for v in teacher],
                reverse_kl=None if kl is None else [finite(v) for v in kl],
                teacher_tokens_read=None if scored is None else sum(scored.teacher_tokens.values()),
                aligned_bytes_fraction=None if scored is None else aligned_fraction(scored),
                top_logprobs=cast(list[list[TopLogprob]] | None, top),
            )
        )
    every_kl = [v for c in completions for v in c.reverse_kl or [] if v is not None]
    base_model, weights = weights_of(task, reader.role)
    return ModelOutput(
        model=reader.role,
        base_model=base_model,
        weights=weights,
        cached=loaded.cached,
        prompt=tokenizer.decode(prompt),
        prompt_tokens=len(prompt),
        prompt_token_ids=prompt,
        prompt_pieces=[tokenizer.decode([token]) for token in prompt]
        if request.prompt_logprobs
        else None,
        completions=completions,
        reverse_kl_mean=sum(every_kl) / len(every_kl) if every_kl else None,
        prompt_logprobs=prompt_logprobs,
        prompt_top_logprobs=prompt_top,
    )


async def answer(task: SampleTask, samplers: SamplerCache) -> SampleAnswer:
    """Complete the task's prompt with each model it asks for, each reading its own
    rendering of it; the student's completions scored by the teacher when it is compared.
    A job that samples on vLLM has its checkpoint sampled on the worker's server for the
    student's base model (the local engine where it has none: the same weights); its base
    and its teacher where they are otherwise (`vllm_served` says why)."""
    start = time.perf_counter()
    roles: list[ModelRole] = [task.request.model, *task.request.compare]
    refusal = missing_reference(compared_teacher(task)[1], task.request)
    if "teacher" in roles and refusal is not None:
        raise OPDError(refusal, code="invalid_prompt")
    on_vllm = task.spec.sampling.engine == "vllm"
    asked = [(*weights_of(task, role), on_vllm and role == "checkpoint") for role in roles]
    async with samplers.using(task.spec, asked) as loaded:
        tokenizers = await asyncio.gather(
            *(asyncio.to_thread(one.client.get_tokenizer) for one in loaded)
        )
        models = readers(task, loaded, tokenizers)
        teacher = next((reader for reader in models if reader.role == "teacher"), None)
        student = next((reader for reader in models if reader.role != "teacher"), None)
        scorer = None
        if teacher is not None and student is not None:
            scorer = teacher_scorer(task, student, teacher)
        outputs = await asyncio.gather(
            *(
                complete(task, reader, None if reader.role == "teacher" else scorer)
                for reader in models
            )
        )
    first = outputs[0]
    return SampleAnswer(
        prompt=first.prompt,
        prompt_tokens=first.prompt_tokens,
        prompt_token_ids=first.prompt_token_ids,
        prompt_pieces=first.prompt_pieces,
        outputs=list(outputs),
        seconds=time.perf_counter() - start,
    )
