"""vLLM's `prompt_logprobs` (`/v1/completions`), as both peers that read them read them: a
teacher on a server (`server.py`) and the student's sampler on vLLM (`vllm.py`), which
are independent of each other."""

from __future__ import annotations

from typing import Any

from worker.engine.backends.contract import TopK


def prompt_logprob_rows(
    rows: list[Any], tokens: list[int], k: int
) -> tuple[list[float | None], list[str], list[TopK | None]]:
    """vLLM's `prompt_logprobs` of `tokens` (a dict per position after the first, keyed by
    token id): each token's logprob (None for the first), its text, and its k likeliest
    (token id, logprob). Raises KeyError, TypeError or ValueError on another shape."""
    logprobs: list[float | None] = [None]
    pieces = [""]
    topk: list[TopK | None] = [None]
    for token, row in zip(tokens[1:], rows[1 : len(tokens)], strict=True):
        own = row[str(token)]
        logprobs.append(float(own["logprob"]))
        pieces.append(str(own.get("decoded_token", "")))
        likeliest = sorted(
            ((int(t), float(v["logprob"])) for t, v in row.items()), key=lambda p: -p[1]
        )
        topk.append(likeliest[:k])
    return logprobs, pieces, topk
