"""What a sampling request may ask of a backend that samples token ids (the local engine, a
vLLM server): PyTRIO's checks and errors, so a request is refused alike on either engine
before any work, and its stop strings read as the same token ids."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from pytrio.errors.base import ValidationError
from pytrio.types import ModelInput, SamplingParams


def invalid(message: str) -> ValidationError:
    return ValidationError(message, code="validation.invalid_sampling_request")


def prompt_tokens(prompt: ModelInput) -> list[int]:
    if prompt.is_empty:
        raise ValidationError("prompt cannot be empty", code="validation.empty_prompt")
    if prompt.has_images:
        raise invalid("this backend samples from text prompts only")
    return prompt.to_ints()


def check_request(num_samples: int, params: SamplingParams, topk_prompt_logprobs: int) -> None:
    """Refuse what PyTRIO refuses: no tokens to sample, no samples, out-of-range knobs."""
    if params.max_tokens is None or params.max_tokens <= 0:
        raise invalid("sampling_params.max_tokens must be greater than 0")
    if num_samples < 1:
        raise invalid("num_samples must be at least 1")
    if params.temperature < 0:
        raise invalid("sampling_params.temperature must be >= 0")
    if not 0 < params.top_p <= 1:
        raise invalid("sampling_params.top_p must be in (0, 1]")
    if params.top_k == 0 or params.top_k < -1:
        raise invalid("sampling_params.top_k must be -1 (off) or >= 1")
    if topk_prompt_logprobs < 0:
        raise invalid("topk_prompt_logprobs must be >= 0")


def stop_token_ids(tokenizer: Any, stop: str | list[str] | list[int] | None) -> frozenset[int]:
    """Stop strings must each be one token (sampling stops on token ids)."""
    if stop is None:
        return frozenset()
    items = [stop] if isinstance(stop, str) else list(stop)
    ids = set()
    for item in items:
        if isinstance(item, int):
            ids.add(item)
            continue
        encoded = tokenizer.encode(item, add_special_tokens=False)
        if len(encoded) != 1:
            raise invalid(
                f"stop string {item!r} is {len(encoded)} tokens; sampling stops only on "
                "strings that are a single token (such as '<|im_end|>') or on token ids"
            )
        ids.add(encoded[0])
    return frozenset(ids)


class Ordinals:
    """How many requests a sampler was asked before, counted by seed: a request seeded
    apart from the others (a cold start's teacher answer, `loop/cold_start.py`) draws the
    same whatever the sampler was asked before it, and a run's own seeded requests count
    as they always did."""

    def __init__(self) -> None:
        self.made: dict[int | None, int] = {}

    def next(self, seed: int | None) -> int:
        ordinal = self.made.get(seed, 0)
        self.made[seed] = ordinal + 1
        return ordinal


def request_seed(seed: int | None, version: int, ordinal: int) -> int:
    """A 63-bit seed for one request of a sampler (its `version`, the steps its weights
    took; `ordinal`, the requests with this seed it was asked before, `Ordinals`): each
    request draws afresh, and a resumed run's the same again. No seed means a fresh random
    one, as in vLLM."""
    if seed is None:
        return secrets.randbits(63)
    digest = hashlib.sha256(f"{seed}:{version}:{ordinal}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
