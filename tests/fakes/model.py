"""A toy language model for the fakes of remote services: deterministic, cheap and honest.

Next-token logits depend on the weights' identity and the previous token only (a bigram
table drawn from a generator seeded by the weights), with the end-of-sequence token given
a fixed probability so completions stay short. Sampling honours max_tokens, temperature,
top_k, top_p, stop and seed the way vLLM does, and each token's logprob is the raw
log-softmax (before temperature and truncation), so scoring a sampled sequence with the
same weights gives back its sampling logprobs. Training changes the weights' identity
through `trained`.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.engine.backends.byte_tokenizer import tiny_tokenizer

TOKENIZER = tiny_tokenizer()
VOCAB = len(TOKENIZER)
EOS = TOKENIZER.eos_token_id
EOS_PROBABILITY = 0.1  # at temperature 1, after every token: completions of ~10 tokens
LOGIT_SCALE = 2.0


def rng_for(*parts: int | str) -> np.random.Generator:
    """A generator that depends only on `parts` (str hashed stably, unlike hash())."""
    return np.random.default_rng(
        [zlib.crc32(part.encode()) if isinstance(part, str) else part for part in parts]
    )


def digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def trained(weights: str, update: str) -> str:
    """The weights after one optimizer step that applied `update` (a digest of the
    gradients and the optimizer's parameters)."""
    return digest(weights, update)


@functools.lru_cache(maxsize=64)
def log_probs(weights: str) -> np.ndarray:
    """[previous token, next token] log-probabilities of the model `weights` names."""
    logits = rng_for("bigram", weights).normal(size=(VOCAB, VOCAB)) * LOGIT_SCALE
    logits[:, EOS] = -np.inf
    others = np.logaddexp.reduce(logits, axis=-1)
    logits[:, EOS] = others + np.log(EOS_PROBABILITY / (1 - EOS_PROBABILITY))
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def score(weights: str, tokens: Sequence[int]) -> list[float | None]:
    """None for the first token (it has no context), then each token's logprob."""
    table = log_probs(weights)
    return [None, *(float(table[a, b]) for a, b in itertools.pairwise(tokens))]


def likeliest(weights: str, tokens: Sequence[int], k: int) -> list[list[tuple[int, float]] | None]:
    """None for the first token, then the k likeliest tokens at each following position
    as (token, logprob), likeliest first (fewer past the vocabulary)."""
    table = log_probs(weights)
    rows: list[list[tuple[int, float]] | None] = [None]
    for previous in tokens[:-1]:
        order = np.argsort(-table[previous], kind="stable")[: min(k, VOCAB)]
        rows.append([(int(token), float(table[previous, token])) for token in order])
    return rows


@dataclass(frozen=True)
class Sampling:
    """What a sampling request asks for, in plain values."""

    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    stop: tuple[tuple[int, ...], ...]
    """Token sequences that end a completion (each kept, as the end-of-sequence token is)."""

    @classmethod
    def of(cls, params: Any) -> Sampling:
        """What PyTRIO's or Tinker's SamplingParams ask for: the two have the same fields."""
        return cls(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            seed=params.seed,
            stop=stop_sequences(params.stop),
        )


@dataclass(frozen=True)
class Draw:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


def stop_sequences(stop: str | Sequence[str] | Sequence[int] | None) -> tuple[tuple[int, ...], ...]:
    """Stop strings as token sequences (a string may span several tokens), or token ids."""
    items = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    return tuple(
        (item,)
        if isinstance(item, int)
        else tuple(TOKENIZER.encode(item, add_special_tokens=False))
        for item in items
    )


def target_logprobs(weights: str, inputs: Sequence[int], targets: Sequence[int]) -> list[float]:
    """log p(targets[t] | inputs[t]) at each position of a training datum."""
    table = log_probs(weights)
    return [float(table[i, max(t, 0)]) for i, t in zip(inputs, targets, strict=True)]


def pick(row: np.ndarray, request: Sampling, rng: np.random.Generator) -> int:
    """vLLM's order: temperature, then top-k, then top-p over what is left."""
    if request.temperature == 0 or request.top_k == 1:
        return int(np.argmax(row))
    scaled = row / request.temperature
    order = np.argsort(-scaled, kind="stable")
    if request.top_k > 0:
        order = order[: request.top_k]
    probs = np.exp(scaled[order] - np.logaddexp.reduce(scaled[order]))
    keep = np.cumsum(probs) - probs < request.top_p
    order, probs = order[keep], probs[keep] / probs[keep].sum()
    return int(order[rng.choice(len(order), p=probs)])


def sample(weights: str, prompt: Sequence[int], num_samples: int, request: Sampling) -> list[Draw]:
    """`num_samples` completions; a seed makes them a function of (weights, seed, prompt)."""
    table = log_probs(weights)
    rng = (
        np.random.default_rng()
        if request.seed is None
        else rng_for("sample", weights, request.seed, *prompt)
    )
    draws = []
    for _ in range(num_samples):
        tokens: list[int] = []
        logprobs: list[float] = []
        previous = prompt[-1]
        stop_reason = "length"
        while len(tokens) < request.max_tokens:
            token = pick(table[previous], request, rng)
            tokens.append(token)
            logprobs.append(float(table[previous, token]))
            previous = token
            if token == EOS or any(tuple(tokens[-len(s) :]) == s for s in request.stop if s):
                stop_reason = "stop"
                break
        draws.append(Draw(tokens, logprobs, stop_reason))
    return draws
