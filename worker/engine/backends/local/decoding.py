"""Batched generation and scoring with a causal LM: pure torch, no event loop.

`generate` samples every row of a batch of requests at once (left padding, attention
mask, KV cache); each request draws its randomness from its own generator, so what it
samples does not depend on which other requests share the batch. Returned logprobs are
the model's raw log-softmax (before temperature, top-k, top-p), as vLLM reports them, so
the importance ratio of an on-policy token is exactly 1 at temperature 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache, PretrainedConfig

# A model call: keyword arguments of a Hugging Face causal LM's forward -> its output.
Forward = Callable[..., Any]

# Most logit elements (rows x padded length x vocabulary) one scoring forward may hold.
LOGIT_BUDGET = 2**28
# Most elements of one [positions, vocabulary] log-softmax the top-k scoring holds at once.
TOPK_SLICE = 2**24

TopK = list[tuple[int, float]]
"""The k likeliest tokens at one position as (token, logprob), likeliest first."""


@dataclass(frozen=True)
class Decoding:
    """One sampling request: its prompt, its settings, and the generator its rows share."""

    prompt: list[int]
    num_samples: int
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    stop_ids: frozenset[int]
    generator: torch.Generator


@dataclass(frozen=True)
class Completion:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device, *, left: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Token ids, attention mask and position ids (0 at each row's first real token)."""
    width = max(1, *(len(seq) for seq in sequences))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        span = slice(width - len(seq), width) if left else slice(0, len(seq))
        ids[row, span] = torch.tensor(seq, dtype=torch.long)
        mask[row, span] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


def row_chunks(lengths: Sequence[int], vocab_size: int) -> list[slice]:
    """Consecutive row ranges whose logits fit LOGIT_BUDGET (at least one row each)."""
    chunks: list[slice] = []
    start = 0
    width = 0
    for row, length in enumerate(lengths):
        width = max(width, length)
        if row > start and (row - start + 1) * width * vocab_size > LOGIT_BUDGET:
            chunks.append(slice(start, row))
            start, width = row, length
    chunks.append(slice(start, len(lengths)))
    return chunks


def target_logprobs(
    forward: Forward,
    inputs: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
) -> Tensor:
    """log p(targets[i][t] | inputs[i][: t + 1]) as a right-padded [rows, length] tensor."""
    ids, mask, positions = pad_batch(inputs, pad_id, device, left=False)
    target_ids, _, _ = pad_batch(targets, 0, device, left=False)
    logits = forward(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    logprobs = logits.float().log_softmax(-1)
    return logprobs.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)


@torch.inference_mode()
def sequence_logprobs(
    forward: Forward,
    sequences: Sequence[list[int]],
    pad_id: int,
    vocab_size: int,
    device: torch.device,
) -> list[list[float | None]]:
    """For each sequence: None for its first token, then each token's logprob."""
    out: list[list[float | None]] = []
    for chunk in row_chunks([len(seq) for seq in sequences], vocab_size):
        rows = sequences[chunk]
        values = target_logprobs(
            forward, [seq[:-1] for seq in rows], [seq[1:] for seq in rows], pad_id, device
        )
        out.extend(
            [None, *row[: len(seq) - 1]] for seq, row in zip(rows, values.tolist(), strict=True)
        )
    return out


@torch.inference_mode()
def sequence_topk(
    forward: Forward,
    requests: Sequence[tuple[list[int], int]],
    pad_id: int,
    vocab_size: int,
    device: torch.device,
) -> list[tuple[list[float | None], list[TopK | None]]]:
    """For each (sequence, k): each token's logprob and the k likeliest tokens at each of
    its positions (both None for the first token), from one forward per chunk of rows;
    the log-softmax is taken a few positions at a time, so beside the logits only the
    top k of each position is held."""
    out: list[tuple[list[float | None], list[TopK | None]]] = []
    for chunk in row_chunks([len(seq) for seq, _ in requests], vocab_size):
        rows = requests[chunk]
        ids, mask, positions = pad_batch([seq[:-1] for seq, _ in rows], pad_id, device, left=False)
        targets, _, _ = pad_batch([seq[1:] for seq, _ in rows], 0, device, left=False)
        logits = forward(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        k = min(max(k for _, k in rows), logits.shape[-1])
        step = max(1, TOPK_SLICE // (logits.shape[0] * logits.shape[-1]))
        chosen, top_values, top_ids = [], [], []
        for start in range(0, logits.shape[1], step):
            logprobs = logits[:, start : start + step].float().log_softmax(-1)
            chosen.append(logprobs.gather(-1, targets[:, start : start + step, None])[..., 0])
            values, indices = logprobs.topk(k, dim=-1)
            top_values.append(values)
            top_ids.append(indices)
        values = torch.cat(chosen, 1).tolist()
        tops = torch.cat(top_values, 1).tolist()
        tokens = torch.cat(top_ids, 1).tolist()
        for row, (seq, wanted) in enumerate(rows):
            length = len(seq) - 1
            out.append(
                (
                    [None, *values[row][:length]],
                    [
                        None,
                        *(
                            list(zip(tokens[row][t][:wanted], tops[row][t][:wanted], strict=True))
                            for t in range(length)
                        ),
                    ],
                )
            )
    return out


def sample_tokens(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, uniforms: Tensor
) -> Tensor:
    """One token per row by inverse-CDF sampling of the truncated, tempered distribution.

    Per row: temperature 0 or top_k 1 is the argmax; top_k -1 and top_p 1 are off. top-k
    applies first, then top-p over the renormalised rest, as vLLM does.
    """
    vocab = logits.shape[-1]
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, 1.0, temperature).unsqueeze(-1)
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    k = torch.where(greedy, 1, torch.where(top_k > 0, top_k, vocab)).clamp(max=vocab)
    keep = torch.arange(vocab, device=logits.device).unsqueeze(0) < k.unsqueeze(-1)
    probs = sorted_logits.masked_fill(~keep, float("-inf")).softmax(-1)
    keep &= probs.cumsum(-1) - probs < top_p.unsqueeze(-1)
    cdf = (probs * keep).cumsum(-1)
    picks = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1), right=True)
    picks = torch.minimum(picks.squeeze(-1), keep.sum(-1) - 1)
    return order.gather(-1, picks.unsqueeze(-1)).squeeze(-1)


@torch.inference_mode()
def generate(
    forward: Forward,
    config: PretrainedConfig,
    requests: Sequence[Decoding],
    pad_id: int,
    device: torch.device,
) -> list[list[Completion]]:
    """Sample every request's rows in one batch; returns each request's completions."""
    owner = [i for i, request in enumerate(requests) for _ in range(request.num_samples)]
    rows = len(owner)

    def per_row(values: Sequence[float | int], dtype: torch.dtype) -> Tensor:
        return torch.tensor([values[i] for i in owner], dtype=dtype, device=device)

    temperature = per_row([r.temperature for r in requests], torch.float32)
    top_k = per_row([r.top_k for r in requests], torch.long)
    top_p = per_row([r.top_p for r in requests], torch.float32)
    max_tokens = per_row([r.max_tokens for r in requests], torch.long)
    stop_width = max(1, *(len(r.stop_ids) for r in requests))
    stop_ids = torch.tensor(
        [
            [*sorted(requests[i].stop_ids), *[-1] * (stop_width - len(requests[i].stop_ids))]
            for i in owner
        ],
        dtype=torch.long,
        device=device,
    )

    ids, mask, positions = pad_batch([requests[i].prompt for i in owner], pad_id, device, left=True)
    cache = DynamicCache(config=config)
    output = forward(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    tokens: list[Tensor] = []
    logprobs: list[Tensor] = []
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    stopped = torch.zeros(rows, dtype=torch.bool, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    for _ in range(max(r.max_tokens for r in requests)):
        logits = output.logits[:, -1].float()
        live = ~done
        uniforms = draw_uniforms(requests, live.cpu()).to(device)
        token = sample_tokens(logits, temperature, top_k, top_p, uniforms)
        tokens.append(token)
        logprobs.append(logits.log_softmax(-1).gather(-1, token.unsqueeze(-1)).squeeze(-1))
        lengths += live
        hit_stop = live & (token.unsqueeze(-1) == stop_ids).any(-1)
        stopped |= hit_stop
        done |= hit_stop | (lengths >= max_tokens)
        if bool(done.all()):
            break
        mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=-1)
        output = forward(
            input_ids=token.unsqueeze(-1),
            attention_mask=mask,
            position_ids=mask.sum(-1, keepdim=True) - 1,
            cache=cache,
            use_cache=True,
        )

    token_rows = torch.stack(tokens, dim=1).cpu().tolist()
    logprob_rows = torch.stack(logprobs, dim=1).cpu().tolist()
    completions: list[list[Completion]] = [[] for _ in requests]
    for row, (length, stop) in enumerate(zip(lengths.tolist(), stopped.tolist(), strict=True)):
        completions[owner[row]].append(
            Completion(
                token_rows[row][:length], logprob_rows[row][:length], "stop" if stop else "length"
            )
        )
    return completions


def draw_uniforms(requests: Sequence[Decoding], live: Tensor) -> Tensor:
    """One uniform per row from its request's generator, drawn only while the request runs.

    Rows are laid out request by request. A request draws for all its rows at every step
    until its last row finishes, so its draws are the same whichever requests share the batch.
    """
    uniforms = torch.zeros(len(live))
    start = 0
    for request in requests:
        span = slice(start, start + request.num_samples)
        if bool(live[span].any()):
            uniforms[span] = torch.rand(request.num_samples, generator=request.generator)
        start = span.stop
    return uniforms
