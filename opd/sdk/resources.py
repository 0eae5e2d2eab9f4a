"""The API's resources, each operation written once (a generator of calls, see
transport.py) and run by whichever client it is reached through: `Client` runs it and
returns the result, `AsyncClient` returns a coroutine; list operations give an iterator
(an async one) that follows `next_cursor` from page to page."""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    TypeVar,
    overload,
)

from pydantic import BaseModel

from app.audit.schemas import AuditEntryPublic, AuditPage
from app.auth.schemas import KeyCreated, KeyPublic, KeysList, Scope
from app.core.pages import Page
from app.files.schemas import FileDetail, FilePublic, FilesPage
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
from app.sweeps.schemas import SweepCreate, SweepDetail, SweepPublic, SweepsPage
from app.teams.schemas import TeamPublic, TeamsList
from app.usage.schemas import GroupBy, UsageReport
from app.webhooks.schemas import (
    DeliveriesPage,
    DeliveryDetail,
    DeliveryPublic,
    WebhookCreated,
    WebhookEvent,
    WebhookPublic,
    WebhooksPage,
)
from kernel.playground import MAX_TIMEOUT_SECONDS, ModelRole
from kernel.spec import JobSpec
from opd.sdk.errors import WaitTimeout
from opd.sdk.progress import Progress, UploadProgress
from opd.sdk.results import ComparedCurves, Curves, Download
from opd.sdk.transport import AsyncTransport, Call, Listing, Pause, Steps, SyncTransport, fetch

P = ParamSpec("P")
T = TypeVar("T")
X = TypeVar("X", SyncTransport, AsyncTransport)
J = TypeVar("J", bound=JobPublic)

REVERSE_KL = "opd/reverse_kl_mean"
MetricNames = str | Sequence[str] | None
UNSET: Any = object()
"""A limit left as it is (None sets it back to the service's default)."""


class Resource(Generic[X]):
    def __init__(self, client: Any, transport: X) -> None:
        self._client = client
        self._transport = transport


class operation(Generic[P, T]):
    """A method written as `Steps`: called on a blocking client's resource it returns the
    result; on an asyncio client's resource, a coroutine of it."""

    via = "run"
    """The transport's method that carries out what the method returns."""

    def __init__(
        self,
        method: Callable[Concatenate[Any, P], Steps[T]] | Callable[Concatenate[Any, P], Listing],
    ) -> None:
        self.method = method
        functools.update_wrapper(self, method)

    @overload
    def __get__(self, resource: Resource[SyncTransport], owner: Any) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, resource: Resource[AsyncTransport], owner: Any
    ) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, resource: Any, owner: Any) -> Any:
        if resource is None:
            return self
        carry_out = getattr(resource._transport, self.via)

        @functools.wraps(self.method)
        def call(*args: Any, **kwargs: Any) -> Any:
            return carry_out(self.method(resource, *args, **kwargs))

        return call


class listing(operation[P, T]):
    """A list method (it returns the first page's `Listing`): an iterator over every item,
    page after page (an async iterator through an asyncio client)."""

    via = "iterate"

    if TYPE_CHECKING:

        @overload  # type: ignore[override]
        def __get__(
            self, resource: Resource[SyncTransport], owner: Any
        ) -> Callable[P, Iterator[T]]: ...
        @overload
        def __get__(
            self, resource: Resource[AsyncTransport], owner: Any
        ) -> Callable[P, AsyncIterator[T]]: ...
        def __get__(self, resource: Any, owner: Any) -> Any: ...


def listed(kind: type[T]) -> Callable[[Callable[Concatenate[Any, P], Listing]], listing[P, T]]:
    """`@listed(EventPublic)`: a `listing` of that item type."""
    return lambda first: listing(first)


def names(keys: MetricNames) -> str | None:
    return keys if keys is None or isinstance(keys, str) else ",".join(keys)


def query(**params: Any) -> dict[str, Any]:
    """The parameters that were given (None is left out)."""
    return {name: value for name, value in params.items() if value is not None}


def written(body: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """A request's body as the caller wrote it: a model's fields that were set (the rest
    are the service's to fill), or the mapping's."""
    if isinstance(body, BaseModel):
        return body.model_dump(mode="json", exclude_unset=True)
    return dict(body)


def renamed(old: str, new: str) -> None:
    """The note an old spelling gives for the one release it is still accepted."""
    warnings.warn(
        f"{old} is deprecated and goes in the next release: use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


def idempotency(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key} if key else {}


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
        messages: Sequence[Mapping[str, str]] | None = None,
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
        timeout_seconds: float | None = None,
        idempotency_key: str | None = None,
    ) -> Steps[PlaygroundAnswer]:
        """The playground: complete `prompt` (or a chat of `messages`, a `text` read as
        given, or `prompt_token_ids`; `prompt_logprobs` scores the prompt too, `top_logprobs`
        adds the likeliest tokens at each position) with the `model` (the `checkpoint`, the
        `teacher` or the untrained `base`), and with the models in `compare`; `teacher` names
        which of several is compared.
        A worker answers; past `timeout_seconds` (the service's default: 60) it is a 504,
        not retried. Retried safely otherwise (a lost answer, a read timeout): the request
        carries an `Idempotency-Key` (one of its own unless you give one), and the API
        answers a repeat with the first answer, sampled and billed once. The read timeout
        is the client's plus the longest the API may wait for a worker."""
        body = query(
            prompt=prompt,
            messages=messages and [dict(m) for m in messages],
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
            timeout_seconds=timeout_seconds,
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


class Sweeps(Resource[X]):
    """`/v1/sweeps`: searches over a job spec, whose trials are the team's jobs."""

    @operation
    def create(
        self, definition: SweepCreate | Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Steps[SweepDetail]:
        """Start a sweep (a `SweepCreate`, or its fields as a mapping, e.g. a YAML file's).
        Retried safely: the request carries an `Idempotency-Key` (one of its own unless you
        give one), so a resent request is the sweep first made."""
        call = Call(
            "POST", "/v1/sweeps", json=written(definition), headers=idempotency(idempotency_key)
        )
        return (yield from fetch(call, SweepDetail))

    @listed(SweepPublic)
    def list(self, *, page_size: int = 100) -> Listing:
        """The caller's sweeps (every team's for an admin key), newest first."""
        return Listing(Call("GET", "/v1/sweeps", params={"limit": page_size}), SweepsPage)

    @operation
    def get(self, sweep_id: int) -> Steps[SweepDetail]:
        """The sweep and its trials (values, status, metric, the best so far)."""
        return (yield from fetch(Call("GET", f"/v1/sweeps/{sweep_id}"), SweepDetail))

    @operation
    def cancel(self, sweep_id: int) -> Steps[SweepDetail]:
        """End the sweep and cancel its unfinished trials."""
        return (yield from fetch(Call("POST", f"/v1/sweeps/{sweep_id}/cancel"), SweepDetail))


class Files(Resource[X]):
    """`/v1/files`: datasets the team uploads, named in specs as `{source: file, file: id}`."""

    @operation
    def upload(
        self,
        path: str | Path,
        *,
        field: str | None = None,
        answer_field: str | None = None,
        format: str | None = None,
        progress: bool = True,
    ) -> Steps[FileDetail]:
        """Upload a JSONL, Parquet or CSV file, streamed from disk (a progress bar on stderr
        unless `progress` is False); the answer is its report. Sent again on a lost answer:
        the same bytes with the same fields answer with the file they made."""
        path = Path(path)
        bar = UploadProgress(path.name, path.stat().st_size) if progress else None
        params = query(filename=path.name, field=field, answer_field=answer_field, format=format)
        call = Call("POST", "/v1/files", params=params, upload=path, sent=bar and bar.sent)
        try:
            return (yield from fetch(call, FileDetail))
        finally:
            if bar is not None:
                bar.close()

    @listed(FilePublic)
    def list(self, *, page_size: int = 100) -> Listing:
        """The team's files, newest first."""
        return Listing(Call("GET", "/v1/files", params={"limit": page_size}), FilesPage)

    @operation
    def get(self, file_id: str) -> Steps[FileDetail]:
        """The file and its report (rows, columns, fields, empty and duplicate questions,
        a preview)."""
        return (yield from fetch(Call("GET", f"/v1/files/{file_id}"), FileDetail))

    @operation
    def download(self, file_id: str, to: str | Path) -> Steps[Download]:
        """The file's bytes as uploaded, written to `to`, their SHA-256 checked on the way."""
        path = Path(to)
        reply = yield Call("GET", f"/v1/files/{file_id}/content", download=path)
        assert reply is not None and reply.sha256 is not None
        return Download(path, reply.sha256)

    @operation
    def delete(self, file_id: str) -> Steps[None]:
        """Delete it (refused while an unfinished job reads it)."""
        yield Call("DELETE", f"/v1/files/{file_id}")


class Usage(Resource[X]):
    def get(
        self,
        *,
        since: date | None = None,
        until: date | None = None,
        group_by: GroupBy | Literal["job", "day"] = GroupBy.job,
        team: str | None = None,
        first: date | None = None,
        last: date | None = None,
    ) -> Any:
        """Tokens per job or per day from `since` to `until` (UTC days; default the last
        30) with estimated costs; `team`: admin keys only. (`first` and `last` are the old
        names of `since` and `until`, kept for one release.)"""
        if first is not None:
            renamed("usage.get(first=)", "usage.get(since=)")
        if last is not None:
            renamed("usage.get(last=)", "usage.get(until=)")
        return self._report(since or first, until or last, group_by, team)

    @operation
    def _report(
        self,
        since: date | None,
        until: date | None,
        group_by: GroupBy | Literal["job", "day"],
        team: str | None,
    ) -> Steps[UsageReport]:
        params = query(
            since=since and since.isoformat(),
            until=until and until.isoformat(),
            group_by=group_by,
            team=team,
        )
        return (yield from fetch(Call("GET", "/v1/usage", params=params), UsageReport))


class Audit(Resource[X]):
    @listed(AuditEntryPublic)
    def list(self, *, action: str | None = None, page_size: int = 100) -> Listing:
        """State-changing requests, newest first (e.g. `action="job.cancel"`)."""
        params = query(action=action, limit=page_size)
        return Listing(Call("GET", "/v1/audit", params=params), AuditPage)


class Keys(Resource[X]):
    """API keys (admin keys only)."""

    @operation
    def list(self) -> Steps[list[KeyPublic]]:
        return (yield from fetch(Call("GET", "/v1/keys"), KeysList)).data

    @operation
    def create(
        self, team: str, *, scope: Scope | str = Scope.submit, expires_in_days: int | None = None
    ) -> Steps[KeyCreated]:
        """A key for `team` (created if new); `.key` is the only copy of the secret."""
        body = query(team=team, scope=scope, expires_in_days=expires_in_days)
        return (yield from fetch(Call("POST", "/v1/keys", json=body, resendable=False), KeyCreated))

    @operation
    def revoke(self, prefix: str) -> Steps[None]:
        yield Call("DELETE", f"/v1/keys/{prefix}")


class Teams(Resource[X]):
    """Teams and their limits (admin keys only)."""

    @operation
    def list(self) -> Steps[list[TeamPublic]]:
        return (yield from fetch(Call("GET", "/v1/teams"), TeamsList)).data

    @operation
    def update(
        self, name: str, *, max_running: int | None = UNSET, max_queued: int | None = UNSET
    ) -> Steps[TeamPublic]:
        """Set the limits given; None puts one back to the service's default."""
        body = {
            field: value
            for field, value in (("max_running", max_running), ("max_queued", max_queued))
            if value is not UNSET
        }
        return (yield from fetch(Call("PATCH", f"/v1/teams/{name}", json=body), TeamPublic))


class Webhooks(Resource[X]):
    """The team's webhooks and what was delivered to them."""

    @operation
    def create(
        self, url: str, events: Sequence[WebhookEvent | str], *, description: str | None = None
    ) -> Steps[WebhookCreated]:
        """Subscribe `url`; `.secret` (shown only here) verifies the signatures."""
        body = query(url=url, events=list(events), description=description)
        return (
            yield from fetch(
                Call("POST", "/v1/webhooks", json=body, resendable=False), WebhookCreated
            )
        )

    @listed(WebhookPublic)
    def list(self) -> Listing:
        return Listing(Call("GET", "/v1/webhooks"), WebhooksPage)

    @operation
    def get(self, webhook_id: int) -> Steps[WebhookPublic]:
        return (yield from fetch(Call("GET", f"/v1/webhooks/{webhook_id}"), WebhookPublic))

    @operation
    def delete(self, webhook_id: int) -> Steps[None]:
        yield Call("DELETE", f"/v1/webhooks/{webhook_id}")

    @listed(DeliveryPublic)
    def deliveries(self, webhook_id: int, *, page_size: int = 100) -> Listing:
        """Each event sent (or being sent) to the webhook, newest first."""
        return Listing(
            Call("GET", f"/v1/webhooks/{webhook_id}/deliveries", params={"limit": page_size}),
            DeliveriesPage,
        )

    @operation
    def delivery(self, webhook_id: int, delivery_id: int) -> Steps[DeliveryDetail]:
        path = f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}"
        return (yield from fetch(Call("GET", path), DeliveryDetail))

    @operation
    def resend(self, webhook_id: int, delivery_id: int) -> Steps[DeliveryPublic]:
        path = f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/resend"
        return (yield from fetch(Call("POST", path), DeliveryPublic))
