"""The student's rollouts on a vLLM server (`sampling.engine: vllm`): each sampler version's
LoRA adapter, as the local backend saves it, loaded into the server at run time under a name
unique to the run and version, sampled through its OpenAI completions with token ids and
each token's logprob, and unloaded once no rollout needs it.

vLLM reports the raw log-softmax of each sampled token (before temperature and top-k/p), as
the local engine does, so the importance ratio reads both alike; a job records how far the
sampler's logprobs are from the trainer's (`opd/sampler_logprob_diff_*`). Requests fail
with errors a person can act on (codes `vllm_*`); a server's answer text never enters them.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from pytrio.types import ModelInput, SampleResponse, SampleSequence, SamplingParams

from kernel.errors import BackendRejected, BackendUnavailable, ServerAway
from kernel.retry import Backoff, retry
from worker.engine.backends.contract import DEFAULT_SAMPLING_PARAMS
from worker.engine.backends.prompt_logprobs import prompt_logprob_rows
from worker.engine.backends.resilient import Warn
from worker.engine.backends.sampling_request import (
    Ordinals,
    check_request,
    prompt_tokens,
    request_seed,
    stop_token_ids,
)

TIMEOUT_SECONDS = 600.0
TOKEN_ID_PREFIX = "token_id:"
RETRY = Backoff(initial=1.0, cap=15.0, attempts=6)
"""A server that went away (restarting, overloaded) is tried this long, about a minute in
all, each retry a warning event; then the job goes back to the queue and resumes from its
last saved state (`ServerAway`), and fails with `vllm_unavailable` once its attempts run
out."""
ADAPTER_PREFIX = "opd-"


JOBS_ON: Counter[str] = Counter()
"""The jobs of this process sampling on each vLLM server of a tier (OPD_VLLM_REPLICAS)."""


class VLLMServer:
    """One vLLM server with runtime LoRA loading on, at `url` (its OpenAI base URL); with
    `tier` (the URLs of every server of the base model, OPD_VLLM_SERVERS' and its
    replicas'), the one with the fewest of this process's jobs on it, the job's adapters
    all there."""

    def __init__(
        self,
        url: str,
        base_model: str,
        warn: Warn = lambda message, data: None,
        backoff: Backoff | None = None,
        folder: Path | None = None,
        tier: Sequence[str] = (),
    ) -> None:
        self.tier = [server.rstrip("/") for server in tier]
        if self.tier:
            url = min(self.tier, key=lambda server: JOBS_ON[server])  # ties: the first listed
            JOBS_ON[url] += 1
        self.url, self.base_model = url.rstrip("/"), base_model
        self.warn, self.backoff = warn, backoff or RETRY
        self.http = httpx.AsyncClient(timeout=TIMEOUT_SECONDS)
        self.run = run_name(folder)
        """Names this job's adapters apart from every other job's on the same server."""
        self.loaded: dict[int, str] = {}
        """The adapter name of each sampler version loaded, by version."""
        self.gate = PromptLogprobsGate()

    @property
    def who(self) -> str:
        return f"the vLLM server {self.url} (OPD_VLLM_SERVERS, for {self.base_model!r})"

    async def get(self, path: str) -> httpx.Response:
        return await self.send(path, None)

    async def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.send(path, body)

    async def send(self, path: str, body: dict[str, Any] | None) -> httpx.Response:
        """`body` to `path` (a GET without one), retried while the server is unreachable or
        failing (every request here may be sent again: sampling, listing, and loading an
        adapter by name)."""
        tries = 0

        async def attempt() -> httpx.Response:
            nonlocal tries
            tries += 1
            try:
                return await self.send_once(path, body)
            except BackendUnavailable as error:
                if tries < (self.backoff.attempts or 0):
                    self.warn(
                        f"Retrying {self.who} (try {tries + 1} of {self.backoff.attempts}) "
                        f"after: {error}",
                        {"server": self.url, "try": tries + 1},
                    )
                raise

        def transient(error: BaseException) -> bool:
            return isinstance(error, BackendUnavailable)

        return await retry(attempt, transient=transient, backoff=self.backoff, what=self.who)

    async def send_once(
        self, path: str, body: dict[str, Any] | None, url: str | None = None
    ) -> httpx.Response:
        """One request to this server (or another of its tier, `url`)."""
        base = url or self.url
        try:
            if body is None:
                response = await self.http.get(f"{base}{path}")
            else:
                response = await self.http.post(f"{base}{path}", json=body)
        except httpx.HTTPError as error:
            raise ServerAway(
                f"{self.who} did not answer ({type(error).__name__}): is it running?",
                code="vllm_unavailable",
            ) from None
        if response.status_code >= 500:
            raise ServerAway(
                f"{self.who} failed (HTTP {response.status_code})", code="vllm_unavailable"
            )
        if response.status_code >= 400:
            raise BackendRejected(
                f"{self.who} refused {path} (HTTP {response.status_code}): it must serve "
                f"{self.base_model!r} with --enable-lora, runtime LoRA loading on and a "
                "--max-lora-rank of at least the student's lora_rank (opd vllm serve)",
                code="vllm_rejected",
            )
        return response

    async def unload_earlier_attempts(self) -> list[str]:
        """Unload the adapters an earlier attempt of this job left loaded (a worker killed
        mid-job cannot unload its own): a resumed attempt loads its versions again under
        the same names. Returns the names unloaded. With a tier, an earlier attempt may
        have sampled on another server of it: those that answer are cleared too."""
        models = (await self.get("/models")).json().get("data") or []
        left = [m["id"] for m in models if str(m.get("id", "")).startswith(f"{self.run}-")]
        for name in left:
            await self.post("/unload_lora_adapter", {"lora_name": name})
        for other in (server for server in self.tier if server != self.url):
            try:
                listed = (await self.send_once("/models", None, other)).json().get("data") or []
                for model in listed:
                    if str(model.get("id", "")).startswith(f"{self.run}-"):
                        body = {"lora_name": model["id"]}
                        await self.send_once("/unload_lora_adapter", body, other)
                        left.append(model["id"])
            except (BackendUnavailable, BackendRejected):
                continue  # away: its adapters went with it, or wait for its restart
        return left

    async def load(self, version: int, path: str, keep: set[int]) -> str:
        """Load the adapter saved at `path` as sampler `version` (a folder the server reads);
        unload the versions loaded before that are not in `keep`. Returns its name."""
        name = f"{self.run}-v{version}"
        if version not in self.loaded:
            await self.post("/load_lora_adapter", {"lora_name": name, "lora_path": path})
            self.loaded[version] = name
        for old in sorted(set(self.loaded) - keep - {version}):
            await self.post("/unload_lora_adapter", {"lora_name": self.loaded.pop(old)})
        return name

    @asynccontextmanager
    async def adapter(self, label: str, path: str) -> AsyncIterator[str]:
        """The adapter saved at `path` loaded for one use (a held-out eval) under this run's
        `label`, unloaded after."""
        name = f"{self.run}-{label}"
        await self.post("/load_lora_adapter", {"lora_name": name, "lora_path": path})
        try:
            yield name
        finally:
            await self.post("/unload_lora_adapter", {"lora_name": name})

    async def aclose(self) -> None:
        """Unload what this run loaded (best effort: the server may be gone), then close."""
        for name in self.loaded.values():
            try:
                await self.post("/unload_lora_adapter", {"lora_name": name})
            except (BackendUnavailable, BackendRejected):
                break
        self.loaded.clear()
        await self.http.aclose()
        if self.tier:
            JOBS_ON[self.url] -= 1


def run_name(folder: Path | None) -> str:
    """The prefix of a job's adapter names: one per job folder (a resumed attempt's is its
    first attempt's, so it finds what that one left), random for a run without one."""
    if folder is None:
        return f"{ADAPTER_PREFIX}{uuid.uuid4().hex[:12]}"
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:12]
    return f"{ADAPTER_PREFIX}{digest}"


class PromptLogprobsGate:
    """Requests that ask for prompt logprobs (`echo`: a self teacher scoring) go one at a
    time, with no other request of the run beside them: vLLM's CPU build (0.32.0) dies
    when one engine step holds the prompt logprobs of two prompts, or them and another
    request. Sampling requests share the server; one waiting to score goes first."""

    def __init__(self) -> None:
        self.changed = asyncio.Condition()
        self.sharing = 0
        self.waiting = 0
        self.alone_now = False

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """A request beside other sampling requests."""
        async with self.changed:
            await self.changed.wait_for(lambda: not self.alone_now and not self.waiting)
            self.sharing += 1
        try:
            yield
        finally:
            async with self.changed:
                self.sharing -= 1
                self.changed.notify_all()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """A request with no other of the run on the server."""
        async with self.changed:
            self.waiting += 1
            try:
                await self.changed.wait_for(lambda: not self.alone_now and not self.sharing)
            finally:
                self.waiting -= 1
            self.alone_now = True
        try:
            yield
        finally:
            async with self.changed:
                self.alone_now = False
                self.changed.notify_all()


class VLLMSampler:
    """A SamplingClient of one adapter (`model`, its name on `server`) over `tokenizer`;
    `version` (the steps its weights took) seeds its requests as the local engine's are
    seeded (`request_seed`), so a seeded run's requests draw afresh, not one stream each."""

    def __init__(self, server: VLLMServer, model: str, tokenizer: Any, version: int = 0) -> None:
        self.server, self.model, self.tokenizer = server, model, tokenizer
        self.version = version
        self.requests_made = Ordinals()

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        """`num_samples` completions of the prompt's token ids, each token with its logprob;
        with `include_prompt_logprobs`, each prompt token's logprob and its
        `topk_prompt_logprobs` likeliest (vLLM's `prompt_logprobs`, at most its
        --max-logprobs, 20 by default), the request alone on the server
        (`PromptLogprobsGate`)."""
        params = sampling_params
        check_request(num_samples, params, topk_prompt_logprobs)
        stops = stop_token_ids(self.tokenizer, params.stop) | {self.tokenizer.eos_token_id}
        scores_prompt = include_prompt_logprobs or topk_prompt_logprobs > 0
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_tokens(prompt),
            "n": num_samples,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "stop_token_ids": sorted(stops - {None}),
        }
        ordinal = self.requests_made.next(params.seed)
        if params.seed is not None:  # vLLM gives the request's n samples seed, seed + 1, ...
            body["seed"] = request_seed(params.seed, self.version, ordinal)
        if scores_prompt:
            body["prompt_logprobs"] = topk_prompt_logprobs
        async with self.server.gate.alone() if scores_prompt else self.server.gate.shared():
            answer = (await self.server.post("/completions", body)).json()
        choices = sorted(answer.get("choices", []), key=lambda choice: choice["index"])
        sequences = [self.sequence(choice, return_text) for choice in choices]
        response = SampleResponse(
            sequences=sequences,
            input_tokens=len(body["prompt"]),
            output_tokens=sum(len(s.tokens) for s in sequences),
        )
        if not scores_prompt:
            return response
        logprobs, topk = self.prompt_scores(choices, body["prompt"], topk_prompt_logprobs)
        return response.model_copy(
            update={"prompt_logprobs": logprobs, "topk_prompt_logprobs": topk}
        )

    def prompt_scores(
        self, choices: list[dict[str, Any]], tokens: list[int], k: int
    ) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
        """Each prompt token's logprob and its k likeliest, from the first choice's
        `prompt_logprobs` (every choice holds the same), read as a server teacher reads them."""
        rows = choices[0].get("prompt_logprobs") if choices else None
        if not isinstance(rows, list) or len(rows) < len(tokens):
            raise BackendRejected(
                f"{self.server.who} answered without a logprob for each prompt token",
                code="vllm_rejected",
            )
        try:
            logprobs, _, topk = prompt_logprob_rows(rows, tokens, k)
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            raise BackendRejected(
                f"{self.server.who} answered with malformed prompt logprobs "
                f"({type(error).__name__})",
                code="vllm_rejected",
            ) from None
        return logprobs, [None if row is None else list(row) for row in topk]

    def sequence(self, choice: dict[str, Any], return_text: bool) -> SampleSequence:
        logprobs = choice.get("logprobs") or {}
        pieces = logprobs.get("tokens") or []
        tokens = [int(piece.removeprefix(TOKEN_ID_PREFIX)) for piece in pieces]
        return SampleSequence(
            stop_reason="length" if choice.get("finish_reason") == "length" else "stop",
            tokens=tokens,
            text=choice.get("text") if return_text else None,
            logprobs=[float(value) for value in logprobs.get("token_logprobs") or []],
        )

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        """`None` for the first token, then the adapter's logprob of each following one
        (the request alone on the server: `PromptLogprobsGate`)."""
        body = {
            "model": self.model,
            "prompt": prompt_tokens(prompt),
            "max_tokens": 0,
            "echo": True,
            "logprobs": 0,
        }
        async with self.server.gate.alone():
            answer = (await self.server.post("/completions", body)).json()
        values = answer["choices"][0]["logprobs"]["token_logprobs"]
        return [None, *(float(value) for value in values[1:])]
