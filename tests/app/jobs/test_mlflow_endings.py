"""The MLflow outbox: every road to a terminal status of a mirrored job writes its run's
ending, in the transition's transaction, and a worker that takes one leaves it to the
others until its next try. (The runs themselves: tests/e2e/test_mlflow.py.)"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from app.core.tables import utcnow
from app.jobs.mlflow_endings import Ending, take_endings
from app.jobs.schemas import JobAction
from app.jobs.store import apply_action, claim_job, complete_job, create_job, fail_job
from app.jobs.tables import MlflowEnding
from kernel.retry import Backoff
from kernel.spec import JobSpec
from tests.app.conftest import small_spec

MIRRORED = {"mlflow": {"tracking_uri": "http://mlflow.internal:5000"}}
MINUTE = Backoff(initial=60.0, cap=60.0)


async def submitted(session, key, **overrides) -> int:
    spec = JobSpec.model_validate(small_spec(**overrides))
    job_id = (await create_job(session, key.team.id, spec)).job.id
    assert job_id is not None
    return job_id


async def endings(session, job_ids: list[int]) -> dict[int, str]:
    query = select(MlflowEnding.job_id, MlflowEnding.status)
    rows = await session.execute(query.where(MlflowEnding.job_id.in_(job_ids)))
    return dict(rows.tuples().all())


async def taken(session, job_id: int, at: datetime) -> list[Ending]:
    """The endings of `job_id` a worker takes at `at` (other tests' are left alone)."""
    return [e for e in await take_endings(session, at, MINUTE, 1000) if e.job_id == job_id]


async def test_every_end_of_a_mirrored_job_is_an_ending_to_send(session, key):
    queued = await submitted(session, key, trackers=MIRRORED)
    paused = await submitted(session, key, trackers=MIRRORED)
    succeeded = await submitted(session, key, trackers=MIRRORED)
    failed = await submitted(session, key, trackers=MIRRORED)
    orphaned = await submitted(session, key, trackers=MIRRORED)
    untracked = await submitted(session, key)

    await apply_action(session, queued, JobAction.cancel)
    await apply_action(session, paused, JobAction.pause)
    every = [queued, paused, succeeded, failed, orphaned, untracked]
    assert await endings(session, every) == {queued: "cancelled"}  # paused: it may resume
    await apply_action(session, paused, JobAction.cancel)
    for job_id in (succeeded, failed, orphaned, untracked):
        await claim_job(session, job_id, "w", heartbeat_timeout=60)
    await complete_job(session, succeeded, "w", "/final")
    await fail_job(session, failed, "w", "bad_dataset", "no rows")
    await apply_action(session, orphaned, JobAction.cancel)  # its worker then dies
    assert await claim_job(session, orphaned, "w2", heartbeat_timeout=-1) is None
    await apply_action(session, untracked, JobAction.cancel)
    await claim_job(session, untracked, "w2", heartbeat_timeout=-1)

    assert await endings(session, every) == {
        queued: "cancelled",
        paused: "cancelled",
        succeeded: "succeeded",
        failed: "failed",
        orphaned: "cancelled",
    }


async def test_an_ending_taken_is_left_to_others_until_its_next_try(session, key):
    job_id = await submitted(session, key, trackers=MIRRORED)
    await apply_action(session, job_id, JobAction.cancel)
    now = utcnow()

    (first,) = await taken(session, job_id, now)
    again = await taken(session, job_id, now + timedelta(seconds=1))
    retried = await taken(session, job_id, now + timedelta(minutes=2))
    late = await taken(session, job_id, now + timedelta(days=2))

    assert first.status == "cancelled" and not first.expired and first.run_id is None
    assert first.spec["trackers"]["mlflow"]["tracking_uri"] == "http://mlflow.internal:5000"
    assert again == [] and len(retried) == 1
    assert [ending.expired for ending in late] == [True]
