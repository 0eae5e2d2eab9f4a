"""Mirrors a run into an MLflow run (trackers.mlflow) without ever holding the run up.

The sink only queues. A background task sends, one call at a time, in a thread of its own
(MLflow's client blocks), and retries with backoff while the tracking server is away: one
event says it became unreachable, one that it caught up. The backlog is bounded; past it
the oldest steps are dropped, and counted, rather than memory growing.

MLflow keeps every value it is sent, while a job resumed after a crash replays the steps
after its last saved state. So a step is sent once no attempt can replay it: when a state
saved after it is recorded (`after_recorded` says when the service's database holds it),
or the run ends for good (`finish`). A run that saves no state for longer than the backlog
sends its oldest steps early. The steps a crash kept from the tracker (it was away) are
sent by the next attempt, from `backfill`.

A run is made with a tag of the caller's choosing (`run_key`, the service's job), and an
attempt that has no run id looks for a run with that tag before it makes one: a crash
between making the run and keeping its id leaves one run, which the next attempt adopts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from kernel.retry import Backoff
from kernel.spec import MlflowSpec
from kernel.spec.documents import flatten
from worker.engine.tracking.sinks import RunInfo, Sink, shown_path, shown_spec

log = logging.getLogger(__name__)

Notify = Callable[[str, str, dict[str, Any] | None], None]
Entry = tuple[str, float, int, int]
"""One metric value as MLflow takes it: (key, value, timestamp in ms, step)."""
Backfill = Callable[[int, int], Awaitable[list[tuple[int, dict[str, Any], int]]]]
"""Steps first..last-1 as recorded: (step, metrics, timestamp in ms) each."""
EVERY_STEP = "opd/reverse_kl_mean"
"""A metric every step has: its last step in MLflow says how far the run got."""

MAX_METRICS = 1000
"""MLflow's limits on one log_batch: 1000 values in all, at most 100 params and 100 tags."""
MAX_PARAMS_OR_TAGS = 100
MAX_VALUE_CHARS = 6000
MAX_KEY_CHARS = 250
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
"""The MLflow status of a run whose job ended so; any other end leaves it RUNNING."""
ENDED = {"FINISHED", "FAILED", "KILLED"}
SPEC_ARTIFACT = "opd/spec.yaml"
"""The job's spec in the run's artifacts, as it would be submitted again."""
FINAL_WEIGHTS_ARTIFACT = "final_weights"
RUN_KEY_TAG = "opd.run_key"
"""The tag that names what a run mirrors, set when it is made (see `keyed_run`)."""
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",  # the mirror retries, without holding anything up
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}


def mlflow_key(name: str) -> str:
    """A metric, param or tag name as MLflow accepts it: `@` spelled `_at_`, any other
    character it refuses as `_` (eval/pass@4 -> eval/pass_at_4)."""
    return re.sub(r"[^\w./\- :]", "_", name.replace("@", "_at_"))[:MAX_KEY_CHARS]


def spec_params(spec: dict[str, Any]) -> dict[str, str]:
    """The flattened spec (as dumped to JSON) as MLflow params (`loop.steps: "30"`), long
    values cut."""
    return {
        mlflow_key(path): (value if isinstance(value, str) else json.dumps(value))[:MAX_VALUE_CHARS]
        for path, value in flatten(spec).items()
    }


def entries(step: int, metrics: dict[str, Any], timestamp: int) -> list[Entry]:
    """A step's values as MLflow takes them; like the service's records, none that is not
    a finite number."""
    return [
        (mlflow_key(name), float(value), timestamp, step)
        for name, value in metrics.items()
        if value is not None and math.isfinite(value)
    ]


def transient(error: BaseException) -> bool:
    """Errors a later try may not have: the server unreachable, timing out, 5xx or 429."""
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException):
        status = error.get_http_status_code()
        return status >= 500 or status == 429
    return isinstance(error, OSError | TimeoutError)


def open_client(uri: str) -> Any:
    for name, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def keyed_run(client: Any, experiment: str, run_key: str) -> str | None:
    """The run made with `run_key` in the experiment, if one was (by an attempt that died
    before its id was kept)."""
    runs = client.search_runs(
        [experiment], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'", max_results=1
    )
    return runs[0].info.run_id if runs else None


def end_run(spec: MlflowSpec, run_id: str | None, run_key: str, outcome: str) -> str | None:
    """End the run of a job that ended as `outcome` (its id, or the one found by its key)
    with that outcome's status, unless it has ended already; its id, None when there is no
    run. Blocks: MLflow's client does."""
    client = open_client(spec.tracking_uri)
    if run_id is None:
        experiment = client.get_experiment_by_name(spec.experiment)
        if experiment is None:
            return None
        run_id = keyed_run(client, experiment.experiment_id, run_key)
        if run_id is None:
            return None
    if client.get_run(run_id).info.status not in ENDED:
        client.set_terminated(run_id, STATUS[outcome])
    return run_id


def experiment_id(client: Any, name: str) -> str:
    """The experiment's id, made if it does not exist yet (by this job or a racing one)."""
    from mlflow.exceptions import MlflowException

    for _ in range(2):
        if (found := client.get_experiment_by_name(name)) is not None:
            return found.experiment_id
        try:
            return client.create_experiment(name)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
    raise RuntimeError(f"experiment {name!r} exists but cannot be read")


class MlflowSink(Sink):
    """Mirrors into the run `run_id` (None: the run made with `run_key`, else a new one,
    reported to `on_run`), with `tags` beside the checkpoint paths. `notify(level, message,
    data)` gets the outage events; `after_recorded(callback)` calls back once the checkpoint
    just reported is durable; `backfill` gives the steps before a resumed attempt's first
    that MLflow lacks. With `team_view` (the service: the server is the team's to read),
    weights' folders are named as a team's key sees them (kernel/team_view.py), in the
    checkpoint tags, the params and the spec artifact alike."""

    def __init__(
        self,
        spec: MlflowSpec,
        *,
        run_id: str | None = None,
        run_key: str | None = None,
        tags: dict[str, str] | None = None,
        notify: Notify = lambda level, message, data: None,
        on_run: Callable[[str], None] = lambda run_id: None,
        after_recorded: Callable[[Callable[[], None]], None] = lambda callback: callback(),
        backfill: Backfill | None = None,
        backlog: int = 10_000,
        backoff: Backoff | None = None,
        team_view: bool = False,
    ) -> None:
        self.spec = spec
        self.team_view = team_view
        self.run_id = run_id
        self.run_key = run_key
        self.tags = dict(tags or {})
        self.notify = notify
        self.on_run = on_run
        self.after_recorded = after_recorded
        self.backfill = backfill
        self.start_step = 0
        self.missing: tuple[int, int] | None = None
        self.backlog = backlog
        self.backoff = backoff or Backoff()
        self.run_name = spec.run_name
        self.params: dict[str, str] = {}
        self.uploads: deque[Callable[[Any, str], None]] = deque()
        """Artifacts to send, each a call on (client, run id)."""
        self.held: dict[int, list[Entry]] = {}
        self.ready: deque[list[Entry]] = deque()
        self.status: str | None = None
        self.ended = False
        self.dropped = 0
        self.down = False
        self.client: Any = None
        self.wake = asyncio.Event()
        self.sender: asyncio.Task[None] | None = None
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="mlflow-mirror")

    # --- what the run reports (the event loop's thread) ---------------------------------------

    def start(self, info: RunInfo) -> None:
        spec = info.spec
        self.run_name = self.run_name or spec.name
        self.start_step = info.start_step
        dumped = shown_spec(spec, self.team_view)
        self.params = spec_params(dumped) | {"dataset_size": str(info.dataset_size)}
        self.tags |= {"opd.backend": spec.backend, "opd.dataset": spec.dataset.source}
        text = yaml.safe_dump(dumped, sort_keys=False, allow_unicode=True)
        self.uploads.append(lambda client, run_id: client.log_text(run_id, text, SPEC_ARTIFACT))
        if self.sender is None:
            self.sender = asyncio.create_task(self._send_all(), name="mlflow-mirror")
        self.wake.set()

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.held[step] = entries(step, metrics, int(time.time() * 1000))
        if len(self.held) > self.backlog:  # no state saved for that long: send the oldest now
            self._release(min(self.held) + 1)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.step(step, metrics)

    def checkpoint(self, step: int, kind: str, path: str) -> None:
        self.tags[
            mlflow_key(f"opd.checkpoint.{kind}" + ("" if kind == "final" else f".{step}"))
        ] = shown_path(path, self.team_view)[:MAX_VALUE_CHARS]
        if kind == "state":
            self.after_recorded(lambda: self._release(step))
        if kind == "final" and self.spec.log_final_weights and Path(path).is_dir():
            self.uploads.append(
                lambda client, run_id: client.log_artifacts(run_id, path, FINAL_WEIGHTS_ARTIFACT)
            )
        self.wake.set()

    def finish(self, outcome: str) -> None:
        """The attempt ended as `outcome` (a job status, or why it stopped): for good, what
        is held goes and the run gets its final status; else the steps a resume replays
        are left to it and the run stays RUNNING."""
        self.status = STATUS.get(outcome)
        if self.status is not None:
            self._release(max(self.held, default=-1) + 1)
        self.held.clear()
        self.ended = True
        self.wake.set()

    async def flushed(self, timeout: float) -> bool:
        """Wait up to `timeout` s for everything to be sent; False if some was not."""
        if self.sender is None:
            return True
        done, _ = await asyncio.wait([self.sender], timeout=timeout)
        return bool(done) and not self.pending()

    def done(self) -> bool:
        """Nothing more will be sent: the attempt ended and the sender stopped."""
        return self.ended and (self.sender is None or self.sender.done())

    def pending(self) -> int:
        """Steps (or parts of steps) and artifacts waiting to be sent."""
        return len(self.ready) + len(self.uploads)

    def _release(self, steps_done: int) -> None:
        """Queue the held steps before `steps_done`; past the backlog (the tracker away for
        long) the oldest queued are dropped, and counted."""
        for step in sorted(s for s in self.held if s < steps_done):
            self.ready.append(self.held.pop(step))
        while len(self.ready) > self.backlog:
            self.ready.popleft()
            self.dropped += 1
        self.wake.set()

    # --- the sender ----------------------------------------------------------------------------

    async def _send_all(self) -> None:
        loop = asyncio.get_running_loop()
        attempt = 0
        try:
            while True:
                self.wake.clear()
                call = self._next_call()
                if call is None:
                    if self.ended:
                        return
                    await self.wake.wait()
                    continue
                run, done, undo = call
                try:
                    result = await loop.run_in_executor(self.thread, run)
                except Exception as error:
                    undo()
                    if not self._retryable(error):
                        return
                    attempt += 1
                    await asyncio.sleep(self.backoff.delay(attempt - 1))
                    continue
                attempt = 0
                done(result)
                if self.missing is not None:
                    await self._fill_in(*self.missing)
                self._note_reached()
        finally:
            self.thread.shutdown(wait=False)

    def _next_call(self) -> tuple[Callable[[], Any], Callable[[Any], None], Callable[[], None]]:
        """The next MLflow call as (run it in the thread, keep its result, give back what it
        took when it failed), or None when nothing is due."""
        if self.client is None:
            return self._open, self._opened, lambda: None
        if self.params or self.tags or self.ready:
            return self._batch()
        if self.uploads:
            upload, client, run_id = self.uploads.popleft(), self.client, self.run_id
            return (
                lambda: upload(client, run_id),
                lambda _: None,
                lambda: self.uploads.appendleft(upload),
            )
        if self.ended and self.status is not None:
            status, run_id, client = self.status, self.run_id, self.client
            self.status = None
            return (
                lambda: client.set_terminated(run_id, status),
                lambda _: None,
                lambda: setattr(self, "status", status),
            )
        return None

    def _open(self) -> tuple[Any, str, bool, int]:
        """(client, run id, whether the id is new to the caller, the steps the run holds)."""
        client = open_client(self.spec.tracking_uri)
        run_id = self.run_id
        if run_id is None:
            experiment = experiment_id(client, self.spec.experiment)
            run_id = self.run_key and keyed_run(client, experiment, self.run_key)
            if not run_id:
                tags = {} if self.run_key is None else {RUN_KEY_TAG: self.run_key}
                run = client.create_run(experiment, run_name=self.run_name, tags=tags)
                return client, run.info.run_id, True, 0
        client.update_run(run_id, status="RUNNING")
        new = self.run_id is None
        if self.backfill is None or self.start_step == 0:
            return client, run_id, new, 0
        history = client.get_metric_history(run_id, EVERY_STEP)
        return client, run_id, new, max((m.step + 1 for m in history), default=0)

    def _opened(self, result: tuple[Any, str, bool, int]) -> None:
        self.client, self.run_id, new, held = result
        if new:
            self.on_run(self.run_id)
        if self.backfill is not None and held < self.start_step:
            self.missing = (max(held, self.start_step - self.backlog), self.start_step)

    async def _fill_in(self, first: int, last: int) -> None:
        """Queue, before this attempt's steps, those a crash kept from the run."""
        assert self.backfill is not None
        self.missing = None
        rows = await self.backfill(first, last)
        self.ready.extendleft(reversed([entries(*row) for row in rows]))
        self._release(-1)  # only to keep the backlog bounded

    def _batch(self) -> tuple[Callable[[], Any], Callable[[Any], None], Callable[[], None]]:
        from mlflow.entities import Metric, Param, RunTag

        params = dict(list(self.params.items())[:MAX_PARAMS_OR_TAGS])
        tags = dict(list(self.tags.items())[:MAX_PARAMS_OR_TAGS])
        for key in params:
            del self.params[key]
        for key in tags:
            del self.tags[key]
        room = MAX_METRICS - len(params) - len(tags)
        entries: list[Entry] = []
        while self.ready and len(entries) + len(self.ready[0]) <= room:
            entries += self.ready.popleft()
        if self.ready and not entries:  # a step with more values than a batch holds
            entries, self.ready[0] = self.ready[0][:room], self.ready[0][room:]
        client, run_id = self.client, self.run_id

        def undo() -> None:
            self.params = params | self.params
            self.tags = tags | self.tags
            if entries:
                self.ready.appendleft(entries)

        return (
            lambda: client.log_batch(
                run_id,
                metrics=[Metric(*entry) for entry in entries],
                params=[Param(k, v) for k, v in params.items()],
                tags=[RunTag(k, v) for k, v in tags.items()],
            ),
            lambda _: None,
            undo,
        )

    def _retryable(self, error: BaseException) -> bool:
        """Report a failed call; True when it is worth another try."""
        if isinstance(error, ImportError):
            self.notify(
                "warning",
                f"MLflow mirroring is off: the worker lacks the mlflow extra "
                f"(pip install 'opd-service[mlflow]'): {error}",
                None,
            )
            return False
        if not transient(error):
            self.notify(
                "warning",
                f"MLflow mirroring stopped: {self.spec.tracking_uri} refused it: {error}",
                {"run_id": self.run_id},
            )
            return False
        if not self.down:
            self.down = True
            log.warning("MLflow at %s unreachable: %s", self.spec.tracking_uri, error)
            self.notify(
                "warning",
                f"MLflow unreachable at {self.spec.tracking_uri}; training goes on and the "
                f"mirror retries in the background: {error}",
                {"run_id": self.run_id},
            )
        return True

    def _note_reached(self) -> None:
        if self.down and not (self.params or self.tags or self.ready or self.uploads):
            self.down = False
            dropped = f"; {self.dropped} steps were dropped (backlog full)" if self.dropped else ""
            self.notify(
                "info",
                f"MLflow caught up: the run has every step due so far{dropped}",
                {"run_id": self.run_id, "dropped_steps": self.dropped},
            )
