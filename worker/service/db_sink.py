"""The database sink: a job's steps, checkpoints and events, written in order, never lost.

The loop calls sinks synchronously; this one queues each write and a background task
applies them in order, one transaction each (a step's metrics and progress together),
retrying with backoff while the database is away. Training keeps going during an
outage and every queued write lands once the database is back, except for a job whose
team has a budget: after each step its spending is checked (app/budgets/service.py), and
the loop waits for that check before the next step (`settled`), so that the team overshoots
its limit by one step at most.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.budgets.service import Verdict, check_spending, fits
from app.core.pricing import PriceTable
from app.core.tables import utcnow
from app.jobs.errors import JobNotHeld
from app.jobs.schemas import JobAction
from app.records.store import (
    record_checkpoint,
    record_eval,
    record_event,
    record_samples,
    record_step,
)
from app.usage.store import PricedModels
from kernel.progress import JobProgress
from kernel.retry import Backoff, retry
from kernel.samples import KeptSample
from worker.engine.tracking.sinks import Sink

log = logging.getLogger(__name__)
Write = Callable[[AsyncSession], Awaitable[Any]]


def database_unreachable(error: BaseException) -> bool:
    """Errors that a later attempt may not have: lost connections, a server restarting."""
    if isinstance(error, DBAPIError):
        return error.connection_invalidated or isinstance(error, OperationalError | InterfaceError)
    return isinstance(error, OSError | TimeoutError | ConnectionError)


async def persist(
    sessions: async_sessionmaker[AsyncSession],
    what: str,
    write: Write,
    backoff: Backoff | None = None,
) -> Any:
    """Apply one write in a session of its own, waiting out a database outage rather than
    losing what it records."""

    async def attempt() -> Any:
        async with sessions() as session:
            return await write(session)

    return await retry(
        attempt, transient=database_unreachable, backoff=backoff or Backoff(), what=what
    )


@dataclass(frozen=True)
class Spending:
    """Whose spending a job's steps count against, and the prices that cost it."""

    team_id: int
    prices: PriceTable
    models: PricedModels
    """The job's priced models, which an eval's tokens cost at."""
    budgeted: bool = True
    """Whether the team had a budget when the attempt started (checked again each step)."""


class DatabaseSink(Sink):
    """Writes through the job store as `worker_id`; reports API requests to `on_action`, a
    takeover to `on_lost`, and a write the database refuses for good to `on_failed`. With
    `spending`, checks the team's budget after each step (a pause is an action too)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        job_id: int,
        worker_id: str,
        on_action: Callable[[JobAction], None],
        on_lost: Callable[[], None],
        on_failed: Callable[[BaseException], None],
        backoff: Backoff | None = None,
        spending: Spending | None = None,
    ) -> None:
        self.sessions = sessions
        self.job_id = job_id
        self.worker_id = worker_id
        self.on_action = on_action
        self.on_lost = on_lost
        self.on_failed = on_failed
        self.backoff = backoff or Backoff()
        self.spending = spending
        self.budgeted = spending is not None and spending.budgeted
        self.now: JobProgress | None = None
        """What the run does now, as it last said."""
        self.writes: asyncio.Queue[Write | None] = asyncio.Queue()
        self.writer = asyncio.create_task(self._write_all(), name=f"db-sink-{job_id}")

    async def _write_all(self) -> None:
        while (write := await self.writes.get()) is not None:
            try:
                result = await persist(
                    self.sessions, f"job {self.job_id} database write", write, self.backoff
                )
            except JobNotHeld:
                log.warning("job %s was taken over; dropping this worker's writes", self.job_id)
                self.on_lost()
                return
            except Exception as error:  # a write the database refuses, not a passing outage
                log.exception("job %s: a write failed for good", self.job_id)
                self.on_failed(error)
                return
            if isinstance(result, JobAction):
                self.on_action(result)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.writes.put_nowait(lambda s: record_step(s, self.job_id, self.worker_id, step, metrics))
        if self.spending is not None:
            self.writes.put_nowait(self.check_spending)

    async def check_spending(self, session: AsyncSession) -> JobAction | None:
        assert self.spending is not None
        verdict: Verdict = await check_spending(
            session, self.spending.team_id, self.spending.prices, utcnow()
        )
        self.budgeted = verdict.budgeted
        return verdict.action

    async def settled(self) -> None:
        """While the team has a budget: wait until every write queued so far (the last
        step's record and its spending check) has landed."""
        if not self.budgeted:
            return
        landed = asyncio.get_running_loop().create_future()
        self.then(lambda: landed.done() or landed.set_result(None))
        await landed

    async def may_spend(self, tokens: int) -> bool:
        """Whether an eval of at most `tokens` fits the team's budget, once every step
        before it is recorded (app/budgets/service.py: `fits`)."""
        spending = self.spending
        if spending is None:
            return True
        await self.settled()
        counts = {"eval_tokens": tokens}

        async def check(session: AsyncSession) -> bool:
            return await fits(
                session, spending.team_id, counts, spending.models, spending.prices, utcnow()
            )

        return await persist(self.sessions, f"job {self.job_id} budget check", check, self.backoff)

    def samples(self, step: int, samples: list[KeptSample]) -> None:
        self.writes.put_nowait(
            lambda s: record_samples(s, self.job_id, self.worker_id, step, samples)
        )

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.writes.put_nowait(lambda s: record_eval(s, self.job_id, self.worker_id, step, metrics))

    def checkpoint(self, step: int, kind: str, path: str) -> None:
        self.writes.put_nowait(
            lambda s: record_checkpoint(s, self.job_id, self.worker_id, step, kind, path)
        )

    def event(self, level: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.writes.put_nowait(lambda s: record_event(s, self.job_id, level, message, data))

    def progress(self, progress: JobProgress) -> None:
        """Kept for the job's heartbeat to write (a write per eval prompt would be many)."""
        self.now = progress

    def then(self, callback: Callable[[], None]) -> None:
        """Call `callback` once every write queued so far has landed."""

        async def call(session: AsyncSession) -> None:
            callback()

        self.writes.put_nowait(call)

    async def drain(self) -> None:
        """Wait until every queued write has landed (or the job was taken over)."""
        self.writes.put_nowait(None)
        await self.writer
