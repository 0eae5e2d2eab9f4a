"""OpenAI's legacy completions wire format (`POST /v1/completions`) as vLLM serves it, and
how it maps onto the playground's request and answer (kernel/playground.py): a prompt, text
or token ids, read as given (no chat template), or a list of them (one playground request
each, their choices in order); `echo` and `logprobs` score the prompt's tokens too, with the
same call the playground scores a text with, so that eval harnesses' loglikelihood tasks
(and a job's teacher server) work against a checkpoint.

`logprobs: k` (and vLLM's `prompt_logprobs: k`) asks the playground for the k likeliest
tokens at each position (`top_logprobs`): a prompt's from the prefill that gives its
logprobs, a sampled token's from a prefill of the prompt and its completion. Each
position's `top_logprobs` holds them and the chosen token, at the value its
`token_logprobs` gives, so that a harness's "is it greedy" (the chosen token's logprob
is the largest there) reads true exactly where the chosen token is the likeliest."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, cast

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator

from app.api.openai.names import ModelName
from app.api.openai.wire import (
    FINISH_REASONS,
    FLOOR_LOGPROB,
    Choices,
    Penalty,
    Strict,
    Temperature,
    TopP,
    Usage,
    WorkerTimeout,
)
from app.stored_completions.schemas import Store, StoredMetadata
from kernel.playground import (
    MAX_PLAYGROUND_TOKENS,
    Completion,
    SampleAnswer,
    SampleRequest,
    TopLogprob,
)

MAX_LOGPROBS = 20
"""The most `logprobs` (and `prompt_logprobs`) asks for, as vLLM's default allows."""
DEFAULT_MAX_TOKENS = 16
"""OpenAI's default for a legacy completion."""
MAX_PROMPTS = 64
"""The most prompts one request may list (each is a worker task of its own)."""
MAX_CHOICES = 64
"""The most choices (prompts x n) one request may ask for."""
PROMPT_FIELDS = {"text": "prompt", "prompt_token_ids": "prompt"}
"""The playground's names for the prompt, as this route's caller named it."""

Prompt = str | list[int] | list[str] | list[list[int]]


class CompletionRequest(Strict):
    """`POST /v1/completions`: a prompt (a text or token ids) or a list of up to 64 (texts
    or token-id lists), with at most 64 choices in all (prompts x n). Each prompt's bounds
    are the playground's (at most 16 completions of at most 4096 tokens, 4 stop strings);
    `max_tokens` defaults to 16, and 0 samples nothing (with `echo` and `logprobs`, or
    `prompt_logprobs`: the prompt is only scored)."""

    model: str = Field(
        max_length=64,
        description="`job-12`, `job-12@step-300`, `job-12:teacher`, or an alias (`support-bot`).",
    )
    prompt: Prompt = Field(
        description="A text (tokenized by the model's own tokenizer with its special "
        "tokens, no template) or ids of that tokenizer, or a list of texts or of token-id "
        "lists: each prompt's choices "
        "follow the previous one's (`index` = prompt's place x n + completion's)."
    )
    max_tokens: int | None = Field(None, ge=0, le=MAX_PLAYGROUND_TOKENS)
    temperature: Temperature = None
    top_p: TopP = None
    n: Choices = None
    best_of: int | None = Field(None, description="Only n (or 1): no reranking.")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, description="Passed to the backend's sampler.")
    echo: bool | None = Field(False, description="The text (and logprobs) start with the prompt.")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="Each token's logprob; `top_logprobs` holds the chosen token and the k "
        "likeliest there.",
    )
    prompt_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="vLLM's: each prompt token's logprob per choice, with the k likeliest "
        "tokens there.",
    )
    frequency_penalty: Penalty = None
    presence_penalty: Penalty = None
    stream: Literal[False] | None = Field(None, description="Only false: no streaming.")
    user: str | None = Field(None, description="Accepted and not used.")
    timeout_seconds: WorkerTimeout = None
    store: Store = False
    metadata: StoredMetadata = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_kind(cls, prompt: Any) -> Any:
        """A list of prompts is all texts or all token-id lists (else the union's four
        errors would say it)."""
        if isinstance(prompt, list) and len({type(item) for item in prompt}) > 1:
            raise ValueError("a list of prompts is all texts or all token-id lists")
        return prompt

    @field_validator("prompt")
    @classmethod
    def _some_prompts(cls, prompt: Prompt) -> Prompt:
        count = len(prompts_of(prompt))
        if not count:
            raise ValueError("give a prompt: a text or token ids")
        if count > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request ({count} given)")
        return prompt

    @field_validator("n")
    @classmethod
    def _bounded_choices(cls, n: int | None, info: ValidationInfo) -> int | None:
        prompts = len(prompts_of(info.data.get("prompt", [])))
        if prompts * (n or 1) > MAX_CHOICES:
            raise ValueError(
                f"at most {MAX_CHOICES} choices per request: {prompts} prompts x n {n} asks "
                "for more"
            )
        return n

    @field_validator("best_of")
    @classmethod
    def _no_reranking(cls, best_of: int | None, info: ValidationInfo) -> int | None:
        if best_of not in (None, 1, info.data.get("n") or 1):
            raise ValueError("only n is supported (no reranking)")
        return best_of

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _only_zero(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("only 0 is supported")
        return value

    def scores_prompt(self) -> bool:
        return (bool(self.echo) and self.logprobs is not None) or self.prompt_logprobs is not None

    def prompts(self) -> list[str | list[int]]:
        return prompts_of(self.prompt)

    def batched(self) -> bool:
        """The prompt came as a list of prompts (not one text or one token-id list)."""
        prompt = self.prompt
        return not isinstance(prompt, str) and bool(prompt) and not isinstance(prompt[0], int)

    def playground_requests(self, name: ModelName) -> list[SampleRequest]:
        """The playground request each prompt asks for (a RequestValidationError naming the
        field and, for a list of prompts, the prompt's place, when a value is beyond the
        playground's bounds)."""
        given = self.model_dump(
            include={"n", "temperature", "top_p", "seed", "timeout_seconds"}, exclude_none=True
        )
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        max_tokens = DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens
        shared = (
            given
            | ({} if stop is None else {"stop": stop})
            | {
                "max_tokens": max_tokens,
                "prompt_logprobs": self.scores_prompt(),
                "top_logprobs": max(self.logprobs or 0, self.prompt_logprobs or 0),
                "checkpoint": name.checkpoint,
                "model": name.role,
            }
        )
        requests, errors = [], []
        for index, prompt in enumerate(self.prompts()):
            field = "text" if isinstance(prompt, str) else "prompt_token_ids"
            try:
                requests.append(SampleRequest.model_validate(shared | {field: prompt}))
            except ValidationError as error:
                errors.extend(
                    e
                    for e in renamed(error.errors(), index if self.batched() else None)
                    if e not in errors  # the shared fields' errors, once
                )
        if errors:
            raise RequestValidationError(errors)
        return requests


def prompts_of(prompt: Prompt) -> list[str | list[int]]:
    """The prompts a request's `prompt` lists: one text, one token-id list, or several."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [cast(list[int], prompt)]  # the union matched list[int]: all ints
    return cast(list[str | list[int]], list(prompt))


class Logprobs(BaseModel):
    """OpenAI's legacy logprobs: per token its text, logprob (null for a prompt's first),
    the likeliest tokens there (the `logprobs` asked for, and itself) and where it starts
    in `text`."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(BaseModel):
    """vLLM's logprob of one token: `rank` is its place among the likeliest (1 the
    likeliest), null for a chosen token beyond the k asked for."""

    logprob: float
    rank: int | None = None
    decoded_token: str


class TextChoice(BaseModel):
    index: int
    text: str
    logprobs: Logprobs | None
    finish_reason: Literal["stop", "length"]
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


def floored(value: float | None) -> float:
    return FLOOR_LOGPROB if value is None else value


Tops = list[list[TopLogprob] | None]
"""The likeliest tokens at each position (null where none were asked for, or at a
prompt's first token)."""


def logprobs_of(tokens: list[str], values: list[float | None], tops: Tops, k: int) -> Logprobs:
    """Legacy logprobs of these tokens; a null value is the prompt's first token's (a
    non-finite one, null in the playground's answer, travels as FLOOR_LOGPROB). Each
    position's top_logprobs: its k likeliest, then the chosen token at its own value."""
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    top_logprobs: list[dict[str, float] | None] = []
    for token, value, top in zip(tokens, values, tops, strict=True):
        if value is None:
            top_logprobs.append(None)
            continue
        likeliest = {t.token: floored(t.logprob) for t in (top or [])[:k]}
        top_logprobs.append(likeliest | {token: value})
    return Logprobs(
        tokens=tokens, token_logprobs=values, top_logprobs=top_logprobs, text_offset=offsets
    )


def prompt_scores(answer: SampleAnswer) -> list[float | None]:
    """The prompt's logprobs by the model asked for: null for the first token only."""
    scored = answer.outputs[0].prompt_logprobs or []
    return [None, *(floored(value) for value in scored[1:])]


def prompt_tops(answer: SampleAnswer) -> Tops:
    return answer.outputs[0].prompt_top_logprobs or [None] * answer.prompt_tokens


def vllm_prompt_logprobs(answer: SampleAnswer, k: int) -> list[dict[str, PromptLogprob] | None]:
    """vLLM's prompt_logprobs: at each prompt token (but the first), itself, then the k
    likeliest tokens there, by token id."""
    ids, pieces = answer.prompt_token_ids or [], answer.prompt_pieces or []
    out: list[dict[str, PromptLogprob] | None] = []
    for token, piece, value, top in zip(
        ids, pieces, prompt_scores(answer), prompt_tops(answer), strict=True
    ):
        if value is None:
            out.append(None)
            continue
        likeliest = (top or [])[:k]
        ranks = {t.token_id: rank for rank, t in enumerate(likeliest, start=1)}
        chosen = PromptLogprob(logprob=value, rank=ranks.get(token), decoded_token=piece)
        out.append(
            {str(token): chosen}
            | {
                str(t.token_id): PromptLogprob(
                    logprob=floored(t.logprob), rank=rank, decoded_token=t.token
                )
                for rank, t in enumerate(likeliest, start=1)
                if t.token_id != token
            }
        )
    return out


def choice_of(
    body: CompletionRequest,
    prompt: str | list[int],
    answer: SampleAnswer,
    index: int,
    completion: Completion,
) -> TextChoice:
    echoed = bool(body.echo)
    prompt_text = prompt if isinstance(prompt, str) else answer.prompt
    tokens = list(completion.tokens)
    values: list[float | None] = [floored(value) for value in completion.logprobs]
    tops: Tops = list(completion.top_logprobs or [None] * len(tokens))
    if echoed and body.logprobs is not None:
        tokens = (answer.prompt_pieces or []) + tokens
        values = prompt_scores(answer) + values
        tops = prompt_tops(answer) + tops
    return TextChoice(
        index=index,
        text=(prompt_text if echoed else "") + completion.text,
        logprobs=None
        if body.logprobs is None
        else logprobs_of(tokens, values, tops, body.logprobs),
        finish_reason=FINISH_REASONS.get(completion.stop_reason, "stop"),
        prompt_logprobs=None
        if body.prompt_logprobs is None
        else vllm_prompt_logprobs(answer, body.prompt_logprobs),
    )


def text_completion(
    body: CompletionRequest, answers: list[SampleAnswer], model: str
) -> TextCompletion:
    """Each prompt's answer's completions by the model asked for (its first output), as
    choices, prompt after prompt (vLLM's order); the usage summed over the prompts; `model`
    the name of the weights that answered (`job-N` for an alias)."""
    choices: list[TextChoice] = []
    prompt_tokens = sampled = 0
    for prompt, answer in zip(body.prompts(), answers, strict=True):
        completions = answer.outputs[0].completions
        choices += [
            choice_of(body, prompt, answer, len(choices) + index, completion)
            for index, completion in enumerate(completions)
        ]
        prompt_tokens += answer.prompt_tokens
        sampled += sum(len(completion.token_ids) for completion in completions)
    return TextCompletion(
        id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=sampled,
            total_tokens=prompt_tokens + sampled,
        ),
    )


def renamed(errors: list[Any], place: int | None) -> list[Any]:
    """The playground's validation errors, the prompt's fields named as the caller named
    them (with the prompt's `place` in a list of prompts)."""
    return [error | {"loc": renamed_loc(error["loc"], place)} for error in errors]


def renamed_loc(loc: tuple[Any, ...], place: int | None) -> tuple[Any, ...]:
    if not loc or loc[0] not in PROMPT_FIELDS:
        return loc
    return (PROMPT_FIELDS[loc[0]], *([] if place is None else [place]), *loc[1:])
