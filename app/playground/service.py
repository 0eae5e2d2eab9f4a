"""The playground's API side, for every door that samples a job's models (the JSON API,
the OpenAI-compatible route, the dashboard's Try it): a request checked against the job's
saved weights, handed to a worker as a short task with a deadline, and its answer read
back, with the database session closed while it waits (app/core/waits.py); then its tokens
added to the job's usage, once. The API process never loads a model.

Before it starts, a request holds the most it may spend against its team's budget
(`most_usage`: each prompt's tokens and n completions of max_tokens, per model), and is
refused when that does not fit what is left (app/budgets/service.py); its usage replaces
the hold once recorded. A worker scoring for a job of the team (a job token) spends as
that job: its steps record the tokens, and their budget check governs it.

A request waits in as many of its team's places (app/core/waits.py) as it asks for
completions (prompts x n x models), so that a list of 64 prompts counts as 64 requests do;
one asking for more than a team may hold is refused at once, saying how to split it.

A request with an Idempotency-Key is answered once (app/playground/replays.py): a repeat joins
the first sending's task while it waits, or gets the answer it kept, and is billed nothing.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession

from app.budgets.estimates import TEMPLATE_TOKENS, another_tokenizer, per_student_token
from app.budgets.service import hold_spending, let_go, settle
from app.core.config import Settings
from app.core.idempotency import Idempotency, IdempotencyMismatch
from app.core.pricing import PriceTable
from app.core.queue import JobQueue, QueueUnavailable
from app.core.tables import utcnow
from app.core.waits import Waits
from app.core.worker_calls import SAMPLE_TASK, TaskUnanswered, call_worker
from app.jobs.checkpoints import CheckpointUnavailable, sampler_weights
from app.jobs.errors import SpecRefused
from app.jobs.schemas import CheckpointPublic
from app.jobs.tables import Job
from app.jobs.visibility import team_checkpoint
from app.jobs.weight_paths import checked_weights, written_paths
from app.playground.replays import Claim, claim, kept_first, release
from app.playground.schemas import PlaygroundAnswer
from app.usage.store import add_usage, models_of
from kernel.playground import (
    Outcome,
    SampleAnswer,
    SampleRequest,
    SampleTask,
    TaskFailure,
    missing_reference,
)
from kernel.spec import JobSpec, stored_spec
from kernel.team_view import in_team_words, masked_data, masked_text

R = TypeVar("R", bound=BaseModel)

REPLAYED_HEADER = "Idempotent-Replayed"
"""Sent (`true`) with an answer kept for an earlier sending of the same request."""

REJECTED = {
    "invalid_prompt",
    "backend_rejected",
    "model_not_found",
    "incompatible_models",
    "checkpoint_config_mismatch",
    "model_too_large",
}
"""Worker failure codes that say the request (or the job's spec) cannot be served: 422."""

STATUS = {"bad_checkpoint": 409, "worker_timeout": 504, "deadline_passed": 504}
"""Other codes with a status of their own; the rest are the worker's or backend's: 502."""


@dataclass
class PlaygroundError(Exception):
    status: int
    code: str
    message: str
    param: str | None = None


def failed(failure: TaskFailure) -> PlaygroundError:
    """A worker's failure as the door answers it: its message in the team's view for every
    key (no worker folder in it), as the answers are."""
    status = 422 if failure.code in REJECTED else STATUS.get(failure.code, 502)
    return PlaygroundError(status, failure.code, masked_text(failure.message))


def answer_usage(answer: SampleAnswer) -> dict[str, int]:
    """What an answer adds to its job's usage counters, counted as training counts them:
    the student's weights (a checkpoint, the base) sampled their completion tokens; the
    teacher read its own prompt and wrote its completions, and read what it took to score
    each completion it was compared with (`teacher_tokens_read`: its prompt and the
    completion, as its own tokens); a student's weights that scored the prompt
    (`prompt_logprobs`) read its tokens too. A model that ranked a completion's tokens
    (`top_logprobs`) read its prompt and its tokens once more. Each model's prompt is its
    own rendering."""
    counts: Counter[str] = Counter()
    for output in answer.outputs:
        written = sum(len(completion.token_ids) for completion in output.completions)
        column = "teacher_tokens" if output.model == "teacher" else "sampled_tokens"
        counts[column] += sum(
            output.prompt_tokens + len(completion.token_ids)
            for completion in output.completions
            if completion.top_logprobs is not None
        )
        if output.model == "teacher":
            counts["teacher_tokens"] += output.prompt_tokens + written
            continue
        counts["sampled_tokens"] += written
        if output.prompt_logprobs is not None:
            counts["sampled_tokens"] += output.prompt_tokens
        counts["teacher_tokens"] += sum(
            completion.teacher_tokens_read or 0 for completion in output.completions
        )
    return {column: tokens for column, tokens in counts.items() if tokens}


def prompt_most(request: SampleRequest, rate: float) -> int:
    """The most tokens a model reads of the request's prompt: one a byte of its text (a
    token holds a byte at least) and its chat template's; token ids as given, each `rate`
    tokens of another tokenizer at most."""
    template = int(TEMPLATE_TOKENS.high)
    if request.prompt_token_ids is not None:
        return math.ceil(len(request.prompt_token_ids) * rate) + template
    text = request.model_dump(
        include={"prompt", "messages", "tools", "text", "reference"}, exclude_none=True
    )
    return len(json.dumps(text, ensure_ascii=False).encode()) + template


def most_usage(spec: JobSpec, requests: Sequence[SampleRequest]) -> dict[str, int]:
    """The most `answer_usage` can count of the requests' answers: each model reads its
    prompt and writes n completions of max_tokens, reads them again when it ranks their
    tokens (`top_logprobs`), and a compared teacher reads each other completion after its
    own prompt, in its own tokens."""
    rate = 1.0 if another_tokenizer(spec) is None else per_student_token(spec).high
    counts: Counter[str] = Counter()
    for request in requests:
        prompt = prompt_most(request, rate)
        models = (request.model, *request.compare)
        for model in models:
            column = "teacher_tokens" if model == "teacher" else "sampled_tokens"
            counts[column] += prompt + request.n * request.max_tokens
            if request.top_logprobs:
                counts[column] += request.n * (prompt + request.max_tokens)
            if model != "teacher" and "teacher" in models:
                scored = prompt + math.ceil(request.max_tokens * rate)
                counts["teacher_tokens"] += request.n * scored
    return dict(counts)


def completions_asked(requests: Sequence[SampleRequest]) -> int:
    """The completions the requests (a door's prompts) ask for: each prompt's n per model."""
    return sum(request.n * (1 + len(request.compare)) for request in requests)


def too_many_completions(requests: Sequence[SampleRequest], most: int) -> PlaygroundError:
    """The refusal of requests that ask for more completions than a team may hold places."""
    request = requests[0]
    if len(requests) > 1:
        asked, param = f"{len(requests)} prompts x n {request.n}", "prompt"
    else:
        asked, param = f"n {request.n} x {1 + len(request.compare)} model(s)", "n"
    return PlaygroundError(
        422,
        "too_many_completions",
        f"this request asks for {completions_asked(requests)} completions ({asked}); a team "
        f"may have at most {most} waiting for a worker at once (OPD_TEAM_MAX_WAITING): send "
        f"them in requests of at most {most} completions each",
        param,
    )


@dataclass(frozen=True)
class Served(Generic[R]):
    """A door's response; `replayed` when it is the answer an earlier sending of the
    request (its Idempotency-Key) kept."""

    value: R
    replayed: bool = False


@dataclass(frozen=True)
class Sampling:
    """What a door's request samples with: its database session, the queue to the
    workers, the settings, the API process's waits, and the caller's team."""

    session: AsyncSession
    queue: JobQueue
    settings: Settings
    waits: Waits
    team_id: int
    scoring: bool = False
    """A worker scoring for a job of the team (a job token): its tokens are that job's
    steps' (`usage/teacher_tokens`) and its budget that job's own step check, so the door
    neither holds nor counts them."""

    async def serve_all(
        self,
        job: Job,
        requests: Sequence[SampleRequest],
        respond: Callable[[list[PlaygroundAnswer]], R],
        kind: type[R],
        idempotency: Idempotency | None = None,
    ) -> Served[R]:
        """The door's response (`respond` makes it of the answers, in the requests'
        order; `kind` reads a kept one) to the completions the requests ask for (prompts
        of one door's request: the same job, weights and teacher), from workers, one task
        each, all waited for in the caller's team's places, one per completion asked for
        (TooManyWaiting when it has not that many left; more than it may ever hold: a
        PlaygroundError at once); BudgetExceeded when their most does not fit what is left
        of the team's budget (a repeat of an answered request still gets its answer);
        PlaygroundError otherwise, the first failure's. The answers' tokens are added to the
        job's usage in place of the hold, in the transaction that keeps the response for a
        repeat."""
        session = self.session
        if completions_asked(requests) > self.waits.per_team:
            raise too_many_completions(requests, self.waits.per_team)
        held: Claim | None = None
        if idempotency is not None:
            try:
                held = await claim(session, self.team_id, idempotency, utcnow())
            except IdempotencyMismatch as error:
                raise PlaygroundError(
                    422, "idempotency_key_reused", str(error), "Idempotency-Key"
                ) from None
            if held.answer is not None:
                return Served(kind.model_validate_json(held.answer), replayed=True)
        hold = None
        try:
            hold = await self.hold(job, requests)
            answers = await self.ask_workers(job, requests, held)
        except Exception:  # nothing to keep: a repeat tries anew
            await let_go(session, hold)
            if held is not None and held.first:
                await release(session, held.id)
            raise
        response = respond(answers)
        if held is not None:
            earlier = await kept_first(session, held.id, response.model_dump_json())
            if earlier is not None:
                await let_go(session, hold)
                return Served(kind.model_validate_json(earlier), replayed=True)
        usage: Counter[str] = Counter()
        for answer in answers:
            usage.update(answer_usage(answer))
        await settle(session, hold)
        await add_usage(session, job, {} if self.scoring else dict(usage), utcnow())
        return Served(response)

    async def hold(self, job: Job, requests: Sequence[SampleRequest]) -> int | None:
        """Hold the requests' most against the team's budget for their wait (nothing for
        a job's scoring, or without a budget); BudgetExceeded when it does not fit."""
        if self.scoring:
            return None
        wait = requests[0].timeout_seconds or self.settings.sample_timeout
        most = most_usage(stored_spec(job.spec), requests)
        prices = PriceTable(self.settings.prices)
        return await hold_spending(
            self.session, self.team_id, most, models_of(job.spec), prices, utcnow(), wait
        )

    async def ask_workers(
        self, job: Job, requests: Sequence[SampleRequest], held: Claim | None
    ) -> list[PlaygroundAnswer]:
        """The workers' answers to the requests, which share their job, weights and
        teacher (the first's are checked); with a claimed row, from the row's tasks, which
        every sending of the requests asks for (so a repeat joins the first's)."""
        session, settings, request = self.session, self.settings, requests[0]
        spec = stored_spec(job.spec)
        teachers = spec.teacher_specs()
        if request.teacher is not None and request.teacher not in teachers:
            message = (
                f"job {job.id} has no teacher {request.teacher!r} (it has {', '.join(teachers)})"
            )
            raise PlaygroundError(422, "invalid_request", f"teacher: {message}", "teacher")
        compared = teachers[request.teacher or next(iter(teachers))]
        server = compared.server
        asks_teacher = "teacher" in (request.model, *request.compare)
        for index, one in enumerate(requests):
            if asks_teacher and (refusal := missing_reference(compared, one)):
                which = f"prompt {index}: " if len(requests) > 1 else ""
                raise PlaygroundError(422, "invalid_request", which + refusal, "reference")
        if server is not None and asks_teacher:
            message = (
                f"job {job.id}'s teacher is model {server.model!r} on the inference server "
                f"{server.url}, which a worker does not load: ask that server"
            )
            param = "model" if request.model == "teacher" else "compare"
            raise PlaygroundError(422, "invalid_request", message, param)
        try:
            checkpoint = await sampler_weights(session, job, request.checkpoint)
        except CheckpointUnavailable as error:
            raise PlaygroundError(422, "invalid_request", str(error), "checkpoint") from None
        try:
            loaded = await checked_weights(session, job.team_id, spec, settings)
        except SpecRefused as error:
            raise PlaygroundError(422, "invalid_request", str(error), error.param) from None
        words, spec = written_paths(spec, loaded), loaded
        timeout = request.timeout_seconds or settings.sample_timeout
        tasks = [
            SampleTask(
                request=one, spec=spec, weights_path=checkpoint.path, deadline=time.time() + timeout
            )
            for one in requests
        ]
        async with self.waits.released(session, self.team_id, completions_asked(requests)):
            raws = await asyncio.gather(
                *(
                    call_worker(
                        self.queue,
                        SAMPLE_TASK,
                        task.model_dump_json(),
                        timeout,
                        self.team_id,
                        task_id=None if held is None else task_id_of(held, index),
                    )
                    for index, task in enumerate(tasks)
                ),
                return_exceptions=True,
            )
        # The team's view for every key: an answer is kept for its replays.
        public = team_checkpoint(CheckpointPublic.model_validate(checkpoint))
        answers = []
        for index, raw in enumerate(raws):
            try:
                answer = answer_of(raw)
            except PlaygroundError as error:
                if len(raws) > 1:  # say which prompt of a door's request failed
                    error.message = f"prompt {index}: {error.message}"
                raise
            shown = team_answer(answer, words).model_dump()
            answers.append(PlaygroundAnswer(**shown, job_id=job.id, checkpoint=public))
        return answers


def team_answer(answer: SampleAnswer, words: dict[str, str]) -> SampleAnswer:
    """The answer with the weights each model loaded named by the rule (kernel/team_view.py):
    saved weights from their job's folder on, a teacher's `model_path` as the team wrote it."""
    outputs = [
        output.model_copy(update={"weights": masked_data(in_team_words(output.weights, words))})
        for output in answer.outputs
    ]
    return answer.model_copy(update={"outputs": outputs})


def answer_of(raw: str | BaseException) -> SampleAnswer:
    """A worker's answer, or the PlaygroundError its failure (or the call's) is."""
    if isinstance(raw, TaskUnanswered):
        raise failed(raw.failure) from None
    if isinstance(raw, QueueUnavailable):
        raise PlaygroundError(503, "queue_unavailable", str(raw)) from None
    if isinstance(raw, BaseException):
        raise raw
    outcome = Outcome[SampleAnswer].model_validate_json(raw)
    if outcome.value is None:
        raise failed(outcome.failure or TaskFailure(code="worker_failed", message="no answer"))
    return outcome.value


def task_id_of(held: Claim, index: int) -> str:
    """The worker task of a claimed request's `index`th prompt (its first: the row's own)."""
    return held.task_id if index == 0 else f"{held.task_id}.{index}"
