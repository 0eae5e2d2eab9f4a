"""A teacher on an inference server: the OpenAI-compatible completions protocol as vLLM and
SGLang serve it (and this service's own `POST /v1/completions`), as a teacher SamplingClient.

It scores token-id prompts with `max_tokens: 0` and either `echo: true, logprobs: k` (the
legacy protocol: each prompt token's logprob, `tokens` its text) or `echo: true` with
vLLM's `prompt_logprobs: k` (keyed by token id: what a top-k objective needs). Calls made at once
are gathered into requests of up to `batch_size` prompts (a list prompt), at most
`max_concurrency` of them in flight; each request is bounded in time and in the size of its
answer, and retried with backoff on 429, 5xx, timeouts and dropped connections. What
still fails becomes an error a person can act on (codes `teacher_server_*`); a server that
answers without prompt logprobs is told so at once, never retried.

The key is the one the operator bound to the server (OPD_TEACHER_SERVERS), given by the
worker, never named by the spec (for this service's own /v1, a maker of short-lived job
tokens, asked for a fresh one every request); a server's answer text never enters an error
or an event (it could echo the key, or anything else): its status code and our code do.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pytrio.types import ModelInput, SampleResponse, SamplingParams

from kernel.errors import BackendAuth, BackendRejected, BackendUnavailable, OPDError
from kernel.retry import Backoff, retry
from kernel.spec import TeacherServer
from kernel.spec.base import MAX_RETRY_DELAY_SECONDS
from worker.engine.backends.contract import DEFAULT_SAMPLING_PARAMS, TopK
from worker.engine.backends.prompt_logprobs import prompt_logprob_rows
from worker.engine.backends.resilient import (
    AUTH_STATUS_CODES,
    Failure,
    Kind,
    Warn,
    network_failure,
)

ANSWER_BASE_BYTES = 1 << 20
ANSWER_BYTES_PER_ENTRY = 512
"""An answer may hold 1 MiB plus this much per (position, alternative) asked for."""
TRANSIENT_STATUS = frozenset({408, 429})
REST_SECONDS = 30.0
"""How long a replica that failed gets no request while another can take it."""
ServerKey = str | Callable[[], str]
"""A server's key, or what makes a fresh one for each request (a job token)."""


class ServerAnswered(Exception):
    """The server answered with an HTTP error status (its text is not kept)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class NoPromptLogprobs(OPDError):
    """The server's answer holds no logprob for each prompt token: it cannot be a teacher."""

    code = "teacher_server_protocol"


@dataclass(frozen=True)
class Scored:
    """One prompt as the server scored it: each token's logprob (None for the first), its
    text, and with k >= 1 the k likeliest (token id, logprob) at each position."""

    logprobs: list[float | None]
    pieces: list[str]
    topk: list[TopK | None] | None = None


@dataclass
class Replica:
    """One server of a teacher tier (OPD_TEACHER_REPLICAS) as every job of this process sees
    it: its requests in flight, those it answered, and until when it rests after failing."""

    url: str
    busy: int = 0
    answered: int = 0
    resting_until: float = 0.0


REPLICAS: dict[str, Replica] = {}
"""Each replica by URL, shared by the jobs of this process, so that the least busy is the
least busy with all of their requests, and one that failed rests for all of them."""


def replica_at(url: str) -> Replica:
    return REPLICAS.setdefault(url, Replica(url))


@dataclass
class Tally:
    """A teacher server's figures since they were last taken (one step's): the seconds the
    job had requests outstanding there, and each replica's share of the requests answered."""

    waited: float
    shares: list[float]


@dataclass
class Waiting:
    """A prompt waiting for the request that will score it."""

    tokens: list[int]
    answer: asyncio.Future[Scored]


def classify(error: BaseException) -> Failure | None:
    """429, 408 and 5xx are worth another try, as are the network's failures; 401 and 403
    are about the key; any other status is the server refusing the request."""
    if isinstance(error, ServerAnswered):
        if error.status in TRANSIENT_STATUS or error.status >= 500:
            return Failure(Kind.transient, str(error))
        kind = Kind.auth if error.status in AUTH_STATUS_CODES else Kind.rejected
        return Failure(kind, str(error))
    return network_failure(error)


def transient(error: BaseException) -> bool:
    failure = classify(error)
    return failure is not None and failure.kind is Kind.transient


class ServerTeacher:
    """The teacher SamplingClient of one server model (`options`), which speaks the
    student's tokens (`tokenizer`, checked by the preflight's `probe`). `who` names it in
    messages and `field` is where the spec writes it (`teacher.server`); `key` is the one
    the operator bound to the server (or its maker), sent as a bearer token (None = none).
    `replicas`: the URLs of the servers behind the spec's (OPD_TEACHER_REPLICAS), each
    request sent to the least busy that is not resting; none: the spec's URL alone."""

    def __init__(
        self,
        options: TeacherServer,
        tokenizer: Any,
        *,
        field: str = "teacher.server",
        warn: Warn = lambda message, data: None,
        transport: httpx.AsyncBaseTransport | None = None,
        key: ServerKey | None = None,
        replicas: Sequence[str] = (),
    ) -> None:
        self.options, self.tokenizer, self.field, self.warn = options, tokenizer, field, warn
        self.key = key
        self.replicas = [replica_at(url.rstrip("/")) for url in replicas or [options.url]]
        self.answered = [0] * len(self.replicas)
        self.told: dict[int, float] = {}
        """The rest of each replica this job's events told of (a rest's end, by index)."""
        self.outstanding, self.outstanding_since, self.waited = 0, 0.0, 0.0
        self.transport = transport
        self.http: httpx.AsyncClient | None = None
        self.waiting: dict[int, list[Waiting]] = {}
        self.flushing: set[int] = set()
        self.sending: set[asyncio.Task[None]] = set()
        self.slots: asyncio.Semaphore | None = None

    @property
    def who(self) -> str:
        return f"teacher server {self.options.url} (model {self.options.model!r})"

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        """`None` for the first token, then the server's logprob of each following token."""
        return (await self.score(prompt.to_ints())).logprobs

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = DEFAULT_SAMPLING_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        """Only the prefill that scores a prompt (its logprobs and their top k), as the
        loop's top-k scoring asks for it: a server teacher never samples here."""
        if not include_prompt_logprobs:
            raise OPDError(
                f"{self.who} only scores tokens; it does not sample for this job",
                code="teacher_server_protocol",
            )
        tokens = prompt.to_ints()
        scored = await self.score(tokens, topk_prompt_logprobs)
        return SampleResponse(
            sequences=[],
            prompt_logprobs=scored.logprobs,
            topk_prompt_logprobs=[
                None if row is None else list(row) for row in scored.topk or [None] * len(tokens)
            ],
        )

    async def score(self, tokens: list[int], k: int = 0) -> Scored:
        """The server's scores of one prompt, sent with the others asked for at once."""
        if not tokens:
            raise ValueError("a prompt to score needs at least one token")
        loop = asyncio.get_running_loop()
        waiting = Waiting(list(tokens), loop.create_future())
        queue = self.waiting.setdefault(k, [])
        queue.append(waiting)
        if len(queue) >= self.options.batch_size:
            self._flush(k)
        elif k not in self.flushing:
            self.flushing.add(k)
            loop.call_soon(self._flush, k)  # after every call made at this moment
        return await waiting.answer

    def _flush(self, k: int) -> None:
        self.flushing.discard(k)
        queue = self.waiting.pop(k, [])
        size = self.options.batch_size
        for start in range(0, len(queue), size):
            task = asyncio.create_task(self._send(queue[start : start + size], k))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def _send(self, batch: list[Waiting], k: int) -> None:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.options.max_concurrency)
        try:
            async with self.slots:
                answers = await self.scored([w.tokens for w in batch], k)
        except Exception as error:
            for waiting in batch:
                if not waiting.answer.done():
                    waiting.answer.set_exception(error)
            return
        except BaseException:  # cancelled: so are its callers' waits
            for waiting in batch:
                waiting.answer.cancel()
            raise
        for waiting, answer in zip(batch, answers, strict=True):
            if not waiting.answer.done():
                waiting.answer.set_result(answer)

    async def scored(self, prompts: list[list[int]], k: int) -> list[Scored]:
        """One request scoring `prompts`, retried as the spec says; its final failure in
        words a person can act on."""
        tries = 0
        last: BaseException | None = None

        async def attempt() -> dict[str, Any]:
            nonlocal tries, last
            if last is not None:
                self.warn(
                    f"Retrying {self.who} (try {tries + 1} of {self.options.max_retries + 1}) "
                    f"after: {describe(last)}",
                    {"server": self.options.url, "try": tries + 1, "error": describe(last)},
                )
            tries += 1
            try:
                return await self.post(self.body(prompts, k), answer_limit(prompts, k))
            except Exception as error:
                last = error
                raise

        backoff = Backoff(
            initial=self.options.retry_delay_seconds,
            cap=MAX_RETRY_DELAY_SECONDS,
            attempts=self.options.max_retries + 1,
        )
        try:
            answer = await retry(attempt, transient=transient, backoff=backoff, what=self.who)
        except Exception as error:
            raise self.failure(error, tries) from error
        return self.read(answer, prompts, k)

    def body(self, prompts: list[list[int]], k: int) -> dict[str, Any]:
        """The completions request that scores `prompts` and samples nothing, at temperature
        1: the teacher's own distribution, also on a server that reports logprobs after its
        sampling settings (vLLM's `--logprobs-mode processed_logprobs`)."""
        body: dict[str, Any] = {
            "model": self.options.model,
            "prompt": prompts[0] if len(prompts) == 1 else prompts,
            "max_tokens": 0,
            "temperature": 1.0,
        }
        if self.options.protocol == "prompt_logprobs":  # echo: vLLM scores without sampling
            return body | {"echo": True, "prompt_logprobs": k}
        return body | {"echo": True, "logprobs": max(k, 1)}

    async def post(self, body: dict[str, Any], limit: int) -> dict[str, Any]:
        """One request on the least busy replica; one that fails as a server down fails
        (refused connection, timeout, 5xx, 429) rests for REST_SECONDS and the request goes
        to the next at once, while another is awake (the retries are the spec's after)."""
        self.outstanding += 1
        if self.outstanding == 1:
            self.outstanding_since = time.monotonic()
        try:
            while True:
                index = self.least_busy()
                replica = self.replicas[index]
                replica.busy += 1
                try:
                    answer = await self.post_to(replica.url, body, limit)
                except Exception as error:
                    if not self.rest(index, error):
                        raise
                    continue
                finally:
                    replica.busy -= 1
                replica.answered += 1
                self.answered[index] += 1
                return answer
        finally:
            self.outstanding -= 1
            if not self.outstanding:
                self.waited += time.monotonic() - self.outstanding_since

    def least_busy(self) -> int:
        """The awake replica with the fewest requests in flight (then the fewest answered,
        so that one request at a time goes round them); all resting: the first to wake."""
        now = time.monotonic()
        order = range(len(self.replicas))
        awake = [i for i in order if self.replicas[i].resting_until <= now]
        if not awake:
            return min(order, key=lambda i: self.replicas[i].resting_until)
        return min(awake, key=lambda i: (self.replicas[i].busy, self.replicas[i].answered))

    def rest(self, index: int, error: BaseException) -> bool:
        """Rest a replica that failed as a server down fails (unless it rests already),
        telling this job's events once a rest when another takes its requests; whether one
        is awake to take this request now."""
        failure = classify(error)
        if len(self.replicas) < 2 or failure is None or failure.kind is not Kind.transient:
            return False
        now, replica = time.monotonic(), self.replicas[index]
        if replica.resting_until <= now:
            replica.resting_until = now + REST_SECONDS
        awake = sum(r.resting_until <= now for r in self.replicas)
        if not awake or self.told.get(index) == replica.resting_until:
            return awake > 0  # with none awake the request fails as the server's
        self.told[index] = replica.resting_until
        self.warn(
            f"Replica {index + 1} of {len(self.replicas)} of {self.who} failed "
            f"({failure.description}): it rests {REST_SECONDS:.0f} s, its requests go to the "
            f"{awake} other{'s' if awake != 1 else ''} awake",
            {
                "server": self.options.url,
                "replica": index + 1,
                "rest_seconds": REST_SECONDS,
                "error": failure.description,
            },
        )
        return True

    def tally(self) -> Tally:
        """The figures since the last tally (`Tally`), then zeroed."""
        waited = self.waited
        if self.outstanding:
            now = time.monotonic()
            waited += now - self.outstanding_since
            self.outstanding_since = now
        self.waited = 0.0
        total = sum(self.answered)
        shares = [answered / total if total else 0.0 for answered in self.answered]
        self.answered = [0] * len(self.replicas)
        return Tally(waited, shares)

    async def post_to(self, base_url: str, body: dict[str, Any], limit: int) -> dict[str, Any]:
        if self.http is None:
            self.http = httpx.AsyncClient(
                timeout=self.options.timeout_seconds,
                transport=self.transport,
                limits=httpx.Limits(max_connections=self.options.max_concurrency),
            )
        url = f"{base_url}/completions"
        async with asyncio.timeout(self.options.timeout_seconds):
            async with self.http.stream("POST", url, json=body, headers=self.headers()) as response:
                content = bytearray()
                async for chunk in response.aiter_bytes():
                    content += chunk
                    if len(content) > limit:
                        raise NoPromptLogprobs(
                            f"{self.who} answered with more than {limit} bytes for "
                            f"{len(body['prompt'])} prompt(s): not a completions answer"
                        )
        if response.status_code >= 400:
            raise ServerAnswered(response.status_code)
        try:
            answer = json.loads(content.decode("utf-8", errors="replace"))
        except json.JSONDecodeError:
            raise NoPromptLogprobs(f"{self.who} answered with no JSON") from None
        if not isinstance(answer, dict):
            raise NoPromptLogprobs(f"{self.who} answered with no completion object")
        return answer

    def headers(self) -> dict[str, str]:
        """The request's bearer token: the bound key, or a fresh one from its maker."""
        key = self.key() if callable(self.key) else self.key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def read(self, answer: dict[str, Any], prompts: list[list[int]], k: int) -> list[Scored]:
        """Each prompt's scores from the answer's choices (one per prompt, by index)."""
        choices = answer.get("choices")
        if not isinstance(choices, list) or len(choices) != len(prompts):
            raise NoPromptLogprobs(
                f"{self.who} answered {len(choices) if isinstance(choices, list) else 'no'} "
                f"choices for {len(prompts)} prompts"
            )
        try:
            ordered = sorted(choices, key=lambda choice: int(choice.get("index", 0)))
            return [self.choice(c, tokens, k) for c, tokens in zip(ordered, prompts, strict=True)]
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            raise NoPromptLogprobs(
                f"{self.who} answered with malformed prompt logprobs ({type(error).__name__}); "
                f"{self.expected}"
            ) from error

    @property
    def expected(self) -> str:
        if self.options.protocol == "prompt_logprobs":
            return "it should serve vLLM's prompt_logprobs (a dict per prompt token, by id)"
        return (
            "it should serve OpenAI's completions with echo and logprobs and max_tokens 0 "
            "(vLLM, SGLang), giving logprobs.token_logprobs for every prompt token"
        )

    def choice(self, choice: dict[str, Any], tokens: list[int], k: int) -> Scored:
        n = len(tokens)
        if self.options.protocol == "prompt_logprobs":
            rows = choice.get("prompt_logprobs")
            if not isinstance(rows, list) or len(rows) < n:
                raise self.missing(rows, n)
            logprobs, pieces, topk = prompt_logprob_rows(rows, tokens, k)
            if k and any(row is not None and len(row) < k for row in topk):
                raise NoPromptLogprobs(
                    f"{self.who} sent fewer than the {k} likeliest tokens asked for at some "
                    "prompt positions: it cannot teach a top-k objective"
                )
            return Scored(logprobs, pieces, topk if k else None)
        logprobs_of = choice.get("logprobs")
        values = logprobs_of.get("token_logprobs") if isinstance(logprobs_of, dict) else None
        if not isinstance(values, list) or len(values) < n:
            raise self.missing(values, n)
        pieces = [str(piece) for piece in (logprobs_of or {}).get("tokens", [])[:n]]
        scored = [None, *(float(v) for v in values[1:n])]
        return Scored(scored, pieces)

    def missing(self, given: Any, n: int) -> NoPromptLogprobs:
        count = f"{len(given)} prompt logprobs" if isinstance(given, list) else "no prompt logprobs"
        return NoPromptLogprobs(
            f"{self.who} answered with {count} for a prompt of {n} tokens: {self.expected}"
        )

    def failure(self, error: BaseException, tries: int) -> BaseException:
        failure = classify(error)
        if failure is None:
            return error
        if failure.kind is Kind.transient:
            return BackendUnavailable(
                f"{self.who} kept failing ({tries} {'try' if tries == 1 else 'tries'}), last "
                f"with: {failure.description}. The server is down or overloaded: submit the "
                f"job again later, or allow more tries with {self.field}.max_retries",
                code="teacher_server_unavailable",
            )
        if failure.kind is Kind.auth:
            sent = "the key the operator bound to it" if self.key else "a request without a key"
            return BackendAuth(
                f"{self.who} refused {sent} ({failure.description}): the operator binds "
                "each server to the worker's variable holding its key in OPD_TEACHER_SERVERS",
                code="teacher_server_auth",
            )
        return BackendRejected(
            f"{self.who} refused the request: {failure.description}",
            code="teacher_server_rejected",
        )

    async def probe(self, tokens: Sequence[int]) -> str | None:
        """Score `tokens` and compare the server's text of each with the tokenizer's: the
        first position where they differ, in words, or None when they agree (a position
        whose token is not text alone, part of a character, is not compared). The words
        quote our tokenizer's text only: the server's is its answer, never repeated."""
        scored = await self.score(list(tokens))
        if len(scored.pieces) < len(tokens):
            return None if not scored.pieces else "the server sent fewer token texts"
        for at, (token, piece) in enumerate(zip(tokens, scored.pieces, strict=False)):
            if at == 0 and not piece:
                continue
            ours = self.tokenizer.decode([token])
            if "\ufffd" not in ours and piece != ours:
                return f"token {at} (id {token}) is {ours!r} here and another text on the server"
        return None

    async def aclose(self) -> None:
        for task in list(self.sending):
            task.cancel()
        if self.http is not None:
            await self.http.aclose()
            self.http = None


def describe(error: BaseException) -> str:
    failure = classify(error)
    return failure.description if failure else f"{type(error).__name__}: {error}"


def answer_limit(prompts: list[list[int]], k: int) -> int:
    """The most bytes an answer scoring `prompts` may hold (answers are bounded)."""
    entries = sum(len(tokens) for tokens in prompts) * (k + 2)
    return ANSWER_BASE_BYTES + entries * ANSWER_BYTES_PER_ENTRY
