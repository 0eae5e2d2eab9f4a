"""Jobs: create, read, wait for, act on, and read what a job recorded (curves, events,
checkpoints, samples), try its weights in the playground, clone it, download them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import (
    Any,
    Generic,
    Literal,
    TypeVar,
)

from app.budgets.schemas import Estimate
from app.core.pages import Page
from app.jobs.schemas import (
    TERMINAL_STATUSES,
    CheckpointKind,
    CheckpointPublic,
    CheckpointsPage,
    EventPublic,
    EventsPage,
    JobPublic,
    JobStatus,
)
from app.playground.schemas import PlaygroundAnswer
from app.samples.schemas import SamplePublic, SamplesPage
from kernel.metric_names import REVERSE_KL
from kernel.playground import MAX_TIMEOUT_SECONDS, ModelRole
from kernel.spec import JobSpec
from opd.sdk.errors import WaitTimeout
from opd.sdk.progress import Progress
from opd.sdk.resources.base import (
    MetricNames,
    Resource,
    X,
    idempotency,
    listed,
    names,
    operation,
    query,
    renamed,
    written,
)
from opd.sdk.results import ComparedCurves, Curves, Download
from opd.sdk.transport import Call, Listing, Pause, Steps, fetch

J = TypeVar("J", bound=JobPublic)


class Jobs(Resource[X], Generic[X, J]):
    """`/v1/jobs`: submit, read, act on jobs, and read what they recorded."""

    def __init__(self, client: Any, transport: X, job: type[J]) -> None:
        super().__init__(client, transport)
        self._job = job

    def _bind(self, job: JobPublic) -> J:
        bound = self._job.model_validate(job, from_attributes=True)
        bound._client = self._client  # type: ignore[attr-defined]
        return bound

    def _one(self, call: Call) -> Steps[J]:
        return self._bind((yield from fetch(call, JobPublic)))

    @operation
    def create(
        self, spec: JobSpec | Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Steps[J]:
        """Submit a job (a `JobSpec`, or its fields as a mapping). Retried safely: the
        request carries an `Idempotency-Key` (one of its own unless you give one). The spec
        goes as written, its unset fields left to the service's defaults, so a retry with
        the same key is the same request after either side upgrades."""
        body = written(spec)
        reply = yield Call("POST", "/v1/jobs", json=body, headers=idempotency(idempotency_key))
        assert reply is not None
        job = self._bind(reply.model(JobPublic))
        job._existed = reply.status == 200  # type: ignore[attr-defined]
        return job

    @operation
    def estimate(self, spec: JobSpec | Mapping[str, Any]) -> Steps[Estimate]:
        """What the job would use (tokens with low, point and high bounds, their cost, the
        basis of each figure, and how it compares with the team's budget), without
        submitting it: the spec is admitted as `create` admits it, nothing is stored."""
        return (yield from fetch(Call("POST", "/v1/jobs/estimate", json=written(spec)), Estimate))

    @operation
    def get(self, job_id: int) -> Steps[J]:
        return (yield from self._one(Call("GET", f"/v1/jobs/{job_id}")))

    @listed(JobPublic)
    def list(
        self,
        *,
        status: JobStatus | str | None = None,
        name: str | None = None,
        sweep: int | None = None,
        metadata: Mapping[str, str] | None = None,
        page_size: int = 100,
    ) -> Listing:
        """The caller's jobs (every team's for an admin key), newest first; filtered as the
        dashboard filters them: `name` (any part, ignoring case), a `sweep`'s trials, the
        `metadata` labels a spec holds."""
        labels = ",".join(f"{key}={value}" for key, value in (metadata or {}).items())
        params = query(
            status=status, name=name, sweep=sweep, metadata=labels or None, limit=page_size
        )
        return Listing(Call("GET", "/v1/jobs", params=params), Page[JobPublic], self._bind)

    @operation
    def cancel(self, job_id: int) -> Steps[J]:
        return (yield from self._one(Call("POST", f"/v1/jobs/{job_id}/cancel")))

    @operation
    def pause(self, job_id: int) -> Steps[J]:
        return (yield from self._one(Call("POST", f"/v1/jobs/{job_id}/pause")))

    @operation
    def resume(self, job_id: int) -> Steps[J]:
        return (yield from self._one(Call("POST", f"/v1/jobs/{job_id}/resume")))

    @operation
    def clone(
        self,
        job_id: int,
        patch: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Steps[J]:
        """A new job from the job's spec changed by a JSON merge patch (`None` in it: the
        field's default), e.g. `{"optim": {"learning_rate": 2e-5}}`."""
        call = Call(
            "POST",
            f"/v1/jobs/{job_id}/clone",
            json=dict(patch or {}),
            headers=idempotency(idempotency_key),
        )
        return (yield from self._one(call))

    @operation
    def wait(
        self,
        job_id: int,
        *,
        progress: bool = False,
        notes: Mapping[str, str] | None = None,
        interval: float = 1.0,
        timeout: float | None = None,
    ) -> Steps[J]:
        """Poll the job until it ends and return it; `progress`: a bar on stderr with the
        steps done and the latest reverse KL, and a line on stdout for each value of a
        metric in `notes` as it is recorded, written by its template (`{step}`, `{value}`:
        `{"eval/accuracy": "step {step}: accuracy {value:.0%}"}`). Past `timeout` seconds:
        WaitTimeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar: Progress | None = None
        seen = dict.fromkeys([REVERSE_KL, *(notes or {})], 0)
        try:
            while True:
                job = yield from self._one(Call("GET", f"/v1/jobs/{job_id}"))
                if progress:
                    bar = bar or Progress(job)
                    new: dict[str, list[tuple[int, float | None]]] = {}
                    for key in seen:
                        params = {"keys": key, "from_step": seen[key], "max_points": 10_000}
                        call = Call("GET", f"/v1/jobs/{job_id}/metrics", params=params)
                        new[key] = (yield from fetch(call, Curves)).points(key)
                        seen[key] = new[key][-1][0] + 1 if new[key] else seen[key]
                    for key, template in (notes or {}).items():
                        for step, value in new[key]:
                            if value is not None:
                                bar.note(template.format(step=step, value=value))
                    values = [value for _, value in new[REVERSE_KL] if value is not None]
                    bar.show(job, values[-1] if values else None)
                if job.status in TERMINAL_STATUSES:
                    return job
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"job {job_id} is still {job.status} after {timeout} s")
                yield Pause(interval)
        finally:
            if bar is not None:
                bar.close()

    @operation
    def metrics(
        self,
        job_id: int,
        keys: MetricNames = None,
        *,
        from_step: int | None = None,
        to_step: int | None = None,
        max_points: int = 1000,
    ) -> Steps[Curves]:
        """The job's curves (every metric, or `keys`), downsampled past `max_points`."""
        params = query(
            keys=names(keys), from_step=from_step, to_step=to_step, max_points=max_points
        )
        return (yield from fetch(Call("GET", f"/v1/jobs/{job_id}/metrics", params=params), Curves))

    @operation
    def compare(
        self,
        job_ids: Sequence[int],
        keys: MetricNames = None,
        *,
        from_step: int | None = None,
        to_step: int | None = None,
        max_points: int = 1000,
    ) -> Steps[ComparedCurves]:
        """The curves of several jobs (at most 20), in the order given: each a `Curves`,
        and `.to_pandas()` for all of them (columns `(job_id, metric)`)."""
        params = query(
            jobs=",".join(map(str, job_ids)),
            keys=names(keys),
            from_step=from_step,
            to_step=to_step,
            max_points=max_points,
        )
        return (yield from fetch(Call("GET", "/v1/metrics", params=params), ComparedCurves))

    @operation
    def export(
        self,
        job_id: int,
        format: Literal["csv", "jsonl"] = "csv",
        keys: MetricNames = None,
        *,
        from_step: int | None = None,
        to_step: int | None = None,
    ) -> Steps[str]:
        """Every recorded step as CSV (`pandas.read_csv(io.StringIO(text))`) or JSON Lines."""
        params = query(format=format, keys=names(keys), from_step=from_step, to_step=to_step)
        reply = yield Call("GET", f"/v1/jobs/{job_id}/metrics/export", params=params)
        assert reply is not None
        return reply.text()

    @listed(EventPublic)
    def events(self, job_id: int, *, page_size: int = 100) -> Listing:
        """The job's timeline, oldest first."""
        return Listing(
            Call("GET", f"/v1/jobs/{job_id}/events", params={"limit": page_size}), EventsPage
        )

    @listed(SamplePublic)
    def samples(self, job_id: int, *, step: int | None = None, page_size: int = 100) -> Listing:
        """The rollouts the job kept, each token with its reverse KL."""
        params = query(step=step, limit=page_size)
        return Listing(Call("GET", f"/v1/jobs/{job_id}/samples", params=params), SamplesPage)

    @listed(CheckpointPublic)
    def checkpoints(
        self, job_id: int, *, kind: CheckpointKind | str | None = None, page_size: int = 100
    ) -> Listing:
        """Saved states, sampler weights and final weights, oldest first."""
        params = query(kind=kind, limit=page_size)
        return Listing(
            Call("GET", f"/v1/jobs/{job_id}/checkpoints", params=params), CheckpointsPage
        )

    @operation
    def download(self, job_id: int, checkpoint_id: int, to: str | Path) -> Steps[Download]:
        """The checkpoint's .tar.gz written to `to`, its SHA-256 checked on the way."""
        path = Path(to)
        call = Call("GET", f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download", download=path)
        reply = yield call
        assert reply is not None and reply.sha256 is not None
        return Download(path, reply.sha256)

    @operation
    def playground(
        self,
        job_id: int,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        text: str | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        prompt_logprobs: bool = False,
        top_logprobs: int = 0,
        checkpoint: int | Literal["final"] = "final",
        model: ModelRole = "checkpoint",
        n: int = 1,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        compare: Sequence[Literal["teacher", "base"]] = (),
        teacher: str | None = None,
        reference: str | None = None,
        timeout_seconds: float | None = None,
        store: bool = False,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> Steps[PlaygroundAnswer]:
        """The playground: complete `prompt` (or a chat of `messages` in OpenAI's format,
        with the `tools` it may call, rendered as training renders a conversation; a
        `text` read as given, or `prompt_token_ids`; `prompt_logprobs` scores the prompt
        too, `top_logprobs` adds the likeliest tokens at each position) with the `model`
        (the `checkpoint`, the `teacher` or the untrained `base`), and with the models in
        `compare`; `teacher` names which of several is compared; `reference` is the answer
        a self teacher with `reference: true` reads after the question. With `store`,
        each model's completions are kept as a stored completion of the team, labelled
        with `metadata` (`stored_completions` lists them; each output's
        `stored_completion_id` names its own).
        A worker answers; past `timeout_seconds` (the service's default: 60) it is a 504,
        not retried. Retried safely otherwise (a lost answer, a read timeout): the request
        carries an `Idempotency-Key` (one of its own unless you give one), and the API
        answers a repeat with the first answer, sampled and billed once. The read timeout
        is the client's plus the longest the API may wait for a worker."""
        body = query(
            prompt=prompt,
            messages=messages and [dict(m) for m in messages],
            tools=tools and [dict(tool) for tool in tools],
            text=text,
            prompt_token_ids=None if prompt_token_ids is None else list(prompt_token_ids),
            prompt_logprobs=prompt_logprobs or None,
            top_logprobs=top_logprobs or None,
            checkpoint=checkpoint,
            model=model,
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=list(stop) or None,
            seed=seed,
            compare=list(compare),
            teacher=teacher,
            reference=reference,
            timeout_seconds=timeout_seconds,
            store=store or None,
            metadata=None if metadata is None else dict(metadata),
        )
        call = Call(
            "POST",
            f"/v1/jobs/{job_id}/playground",
            json=body,
            headers=idempotency(idempotency_key),
            retry_server_errors=False,
            waits=timeout_seconds or MAX_TIMEOUT_SECONDS,
        )
        return (yield from fetch(call, PlaygroundAnswer))

    def sample(self, job_id: int, prompt: str | None = None, **options: Any) -> Any:
        """Deprecated: the old name of `playground` (kept for one release)."""
        renamed("jobs.sample", "jobs.playground")
        return self.playground(job_id, prompt, **options)
