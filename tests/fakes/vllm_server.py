"""A real HTTP server that answers `POST /v1/completions` in vLLM's shapes (echo + logprobs,
or `prompt_logprobs` keyed by token id), run by uvicorn in a thread of the test process.

Its "model" gives each position a row of logprobs over the vocabulary (by default token t
at position i has `score(t, i)`; `row` may be any model's, e.g. the PyTRIO fake's bigram),
and with top-k the k likeliest ids at each position (the token itself beside them).
`script` makes it misbehave on the next requests: an HTTP status, a wait longer than the
client's timeout, or an answer without prompt logprobs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from opd.serve import free_port

VOCAB = 256


def score(token: int, position: int) -> float:
    """The fake model's logprob of `token` at `position` (not normalised: a fixture)."""
    return -((token * 7 + position * 3) % 17) / 8.0 - 0.05


def piece(token: int) -> str:
    """A token's text: its byte, as the tests' byte-level tokenizer decodes it."""
    return bytes([token % VOCAB]).decode("latin-1")


def score_row(tokens: list[int], position: int) -> np.ndarray:
    """The default model's logprobs at `position`, over the vocabulary."""
    return np.array([score(t, position) for t in range(VOCAB)])


class ByteTokenizer:
    """The tokenizer the fake server's model reads (one token a byte)."""

    def decode(self, tokens: list[int]) -> str:
        return "".join(piece(token) for token in tokens)


@dataclass
class FakeVLLM:
    """What the server answers, and what it was asked."""

    script: list[Any] = field(default_factory=list)
    """Per request, first: an HTTP status (int), "slow" (wait `slow_seconds`), "no_logprobs",
    or "ok"; once empty every request is answered."""
    slow_seconds: float = 5.0
    row: Callable[[list[int], int], np.ndarray] = score_row
    """The model: logprobs over the vocabulary at a position of a prompt."""
    decode: Callable[[int], str] = piece
    """Its tokenizer: a token id's text."""
    offset: int = 0
    """Added to every id before its text is given (a server with another tokenizer)."""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            body = await request.json()
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            step = self.script.pop(0) if self.script else "ok"
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await asyncio.sleep(0.02)  # long enough for requests in flight to overlap
                if isinstance(step, int):
                    # A hostile server echoes what it was sent: it must reach no error.
                    echo = f"scripted {step}; echo: auth={request.headers.get('authorization')}"
                    error = {"message": echo, "type": "error", "code": step}
                    return JSONResponse({"error": error}, status_code=step)
                if step == "slow":
                    await asyncio.sleep(self.slow_seconds)
                return JSONResponse(self.answer(body, logprobs=step != "no_logprobs"))
            finally:
                self.in_flight -= 1

        return app

    def answer(self, body: dict[str, Any], *, logprobs: bool) -> dict[str, Any]:
        prompts = body["prompt"]
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        choices = [
            self.choice(index, tokens, body, logprobs) for index, tokens in enumerate(prompts)
        ]
        tokens = sum(len(p) for p in prompts)
        usage = {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": choices,
            "usage": usage,
        }

    def choice(
        self, index: int, tokens: list[int], body: dict[str, Any], logprobs: bool
    ) -> dict[str, Any]:
        texts = [self.decode(token + self.offset) for token in tokens]
        rows = [None, *(self.row(tokens, i) for i in range(1, len(tokens)))]
        values = [
            None if row is None else float(row[t]) for row, t in zip(rows, tokens, strict=True)
        ]
        choice: dict[str, Any] = {
            "index": index,
            "text": "".join(texts) if body.get("echo") else "",
            "logprobs": None,
            "finish_reason": "length",
            "prompt_logprobs": None,
        }
        if not logprobs:
            return choice
        if body.get("echo") and body.get("logprobs") is not None:
            offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
            top = [None if v is None else {t: v} for t, v in zip(texts, values, strict=True)]
            choice["logprobs"] = {
                "tokens": texts,
                "token_logprobs": values,
                "top_logprobs": top,
                "text_offset": offsets,
            }
        if body.get("prompt_logprobs") is not None:
            k = body["prompt_logprobs"]
            choice["prompt_logprobs"] = [None] + [
                self.position(token, row, k)
                for token, row in zip(tokens, rows, strict=True)
                if row is not None
            ]
        return choice

    def position(self, token: int, row: np.ndarray, k: int) -> dict[str, Any]:
        """vLLM's dict at one prompt position: the token itself and the k likeliest."""
        ranked = sorted(range(len(row)), key=lambda t: (-row[t], t))
        return {
            str(t): {
                "logprob": float(row[t]),
                "rank": ranked.index(t) + 1,
                "decoded_token": self.decode(t + self.offset),
            }
            for t in [*ranked[:k], token]
        }


@contextmanager
def serving(fake: FakeVLLM) -> Iterator[str]:
    """The fake on a free port of 127.0.0.1 until the block ends; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(fake.app(), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the fake vLLM did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(30)
