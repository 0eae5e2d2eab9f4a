"""PyTRIO's SamplingClient over a local model and a frozen set of weights.

A sampler made from a training client holds a copy of the LoRA weights of that moment
and applies them per call (`torch.func.functional_call`), so later training never
changes what it samples. Each request seeds its own generator from (seed, the sampler's
version = the optimizer-step count it was made at, the request's ordinal among those with
its seed), which makes a resumed run sample exactly what the uninterrupted run sampled.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from pytrio.types import ModelInput, SampleResponse, SampleSequence, SamplingParams
from torch import Tensor
from torch.func import functional_call

from worker.engine.backends.local.decoding import (
    Completion,
    Decoding,
    TopK,
    generate,
    sequence_logprobs,
    sequence_topk,
)
from worker.engine.backends.local.models import Placement
from worker.engine.backends.local.runner import Coalescer, SerialRunner
from worker.engine.backends.sampling_request import (
    Ordinals,
    check_request,
    prompt_tokens,
    request_seed,
    stop_token_ids,
)

DEFAULT_SAMPLING_PARAMS = SamplingParams()


class LocalSamplingClient:
    def __init__(
        self,
        runner: SerialRunner,
        model: torch.nn.Module,
        tokenizer: Any,
        placement: Placement,
        weights: dict[str, Tensor],
        version: int,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.placement = placement
        self.weights = weights
        self.version = version
        self.requests_made = Ordinals()
        self.eos_ids = end_of_sequence_ids(model, tokenizer)
        self.sampling = Coalescer(runner, self.generate_batch)
        self.scoring = Coalescer(runner, self.score_batch)
        self.ranking = Coalescer(runner, self.rank_batch)

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    @property
    def memory_bytes(self) -> int:
        """What the model and its weights hold in memory (a playground's cache weighs it)."""
        tensors = [*self.model.parameters(), *self.model.buffers(), *self.weights.values()]
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        """With `topk_prompt_logprobs` k >= 1, also the k likeliest tokens at each prompt
        position (None at the first), from the same prefill as its prompt logprobs."""
        check_request(num_samples, sampling_params, topk_prompt_logprobs)
        decoding = self.decoding(prompt_tokens(prompt), num_samples, sampling_params)
        topk: list[TopK | None] = []
        if topk_prompt_logprobs:
            completions, (prompt_logprobs, topk) = await asyncio.gather(
                self.sampling.submit(decoding),
                self.ranking.submit((decoding.prompt, topk_prompt_logprobs)),
            )
        elif include_prompt_logprobs:
            completions, prompt_logprobs = await asyncio.gather(
                self.sampling.submit(decoding), self.scoring.submit(decoding.prompt)
            )
        else:
            completions, prompt_logprobs = await self.sampling.submit(decoding), []
        return SampleResponse(
            sequences=[self.sequence(c, return_text) for c in completions],
            prompt_logprobs=prompt_logprobs if include_prompt_logprobs else [],
            topk_prompt_logprobs=topk,
            input_tokens=len(decoding.prompt),
            output_tokens=sum(len(c.tokens) for c in completions),
        )

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        """`None` for the first token, then the logprob of each following token."""
        return await self.scoring.submit(prompt_tokens(prompt))

    def decoding(self, prompt: list[int], num_samples: int, params: SamplingParams) -> Decoding:
        """One checked request (`check_request`), with a generator of its own."""
        ordinal = self.requests_made.next(params.seed)
        return Decoding(
            prompt=prompt,
            num_samples=num_samples,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            stop_ids=self.eos_ids | stop_token_ids(self.tokenizer, params.stop),
            generator=torch.Generator().manual_seed(
                request_seed(params.seed, self.version, ordinal)
            ),
        )

    def sequence(self, completion: Completion, return_text: bool) -> SampleSequence:
        text = (
            self.tokenizer.decode(completion.tokens, skip_special_tokens=True)
            if return_text
            else None
        )
        return SampleSequence(
            stop_reason=completion.stop_reason,
            tokens=completion.tokens,
            text=text,
            logprobs=completion.logprobs,
        )

    def forward(self, **kwargs: Any) -> Any:
        return functional_call(self.model, self.weights, args=(), kwargs=kwargs)

    def generate_batch(self, requests: list[Decoding]) -> list[list[Completion]]:
        return generate(
            self.forward,
            self.model.config,
            requests,
            self.tokenizer.pad_token_id,
            self.placement.device,
        )

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def score_batch(self, prompts: list[list[int]]) -> list[list[float | None]]:
        return sequence_logprobs(
            self.forward,
            prompts,
            self.tokenizer.pad_token_id,
            self.vocab_size,
            self.placement.device,
        )

    def rank_batch(
        self, requests: list[tuple[list[int], int]]
    ) -> list[tuple[list[float | None], list[TopK | None]]]:
        return sequence_topk(
            self.forward,
            requests,
            self.tokenizer.pad_token_id,
            self.vocab_size,
            self.placement.device,
        )


class AdapterOffSamplingClient(LocalSamplingClient):
    """A training model's base, its LoRA adapter off (peft's `disable_adapter`): a self
    teacher of `base` weights, with no second copy of them. Every call runs on the
    backend's one thread, inside the context, so no training call sees the adapter off."""

    def forward(self, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(**kwargs)


def end_of_sequence_ids(model: torch.nn.Module, tokenizer: Any) -> frozenset[int]:
    """The ids generation always stops at: the tokenizer's and the model's EOS, as vLLM does."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    return frozenset(i for i in [*ids, tokenizer.eos_token_id] if i is not None)
