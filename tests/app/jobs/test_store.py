"""A job's state changes on SQLite and Postgres: what the API and the worker may do."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import select

from app.core.idempotency import Idempotency, IdempotencyMismatch
from app.jobs.errors import JobNotHeld
from app.jobs.rows import get_job
from app.jobs.schemas import JobAction, JobStatus
from app.jobs.store import (
    apply_action,
    claim_job,
    complete_job,
    create_job,
    fail_job,
    heartbeat,
    release_unrun,
    stop_job,
)
from app.jobs.tables import Event
from app.records.store import record_checkpoint, record_step
from kernel.spec import JobSpec
from tests.app.conftest import events_of, small_spec

S = JobStatus


async def test_create_writes_a_queued_job_and_an_event(session, job):
    assert job.status == JobStatus.queued
    assert job.total_steps == 3
    assert job.created_at == job.updated_at
    assert await events_of(session, job.id) == ["Job created"]


async def test_idempotency_mismatch_is_refused(session, key):
    spec = JobSpec.model_validate(small_spec())
    sent = Idempotency("key-1", "POST /v1/jobs", small_spec())
    first = await create_job(session, key.team.id, spec, sent)
    repeat = await create_job(session, key.team.id, spec, sent)
    assert (repeat.job.id, repeat.changed) == (first.job.id, False)
    other = Idempotency("key-1", "POST /v1/jobs", small_spec(name="other"))
    with pytest.raises(IdempotencyMismatch, match="different body"):
        await create_job(session, key.team.id, spec.model_copy(update={"name": "other"}), other)


async def test_claim_starts_a_queued_job_once(session, sessions, job):
    claimed = await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    assert claimed.status == JobStatus.running
    assert (claimed.attempts, claimed.worker_id) == (1, "w1")
    assert claimed.started_at is not None and claimed.heartbeat_at is not None
    assert await claim_job(session, job.id, "w2", heartbeat_timeout=60) is None, "w1 is alive"


async def test_concurrent_claims_have_one_winner(sessions, job):
    async def claim(worker: str):
        async with sessions() as session:
            return await claim_job(session, job.id, worker, heartbeat_timeout=60)

    results = await asyncio.gather(*(claim(f"w{i}") for i in range(4)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert winners[0].attempts == 1


async def test_a_dead_workers_job_is_taken_over_from_its_state(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await record_checkpoint(session, job.id, "w1", 2, "state", "/s/state-000002")
    await record_step(session, job.id, "w1", 2, {"m": 1.0})
    taken = await claim_job(session, job.id, "w2", heartbeat_timeout=0)
    assert (taken.attempts, taken.worker_id) == (2, "w2")
    assert (taken.last_state_path, taken.steps_done) == ("/s/state-000002", 2)
    with pytest.raises(JobNotHeld):
        await heartbeat(session, job.id, "w1")
    with pytest.raises(JobNotHeld):
        await record_step(session, job.id, "w1", 3, {"m": 1.0})
    assert "took over on w2" in (await events_of(session, job.id))[-1]


@pytest.mark.parametrize(
    ("request_action", "final"), [("cancel", S.cancelled), ("pause", S.paused)]
)
async def test_a_dead_workers_pending_request_is_carried_out(session, job, request_action, final):
    """A pause at the state a resume goes on from; a cancel keeps the steps it ran."""
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await record_checkpoint(session, job.id, "w1", 1, "state", "/s/state-000001")
    for step in (1, 2):
        await record_step(session, job.id, "w1", step, {"m": 1.0})
    await apply_action(session, job.id, JobAction(request_action))
    assert await claim_job(session, job.id, "w2", heartbeat_timeout=0) is None
    ended = await get_job(session, job.id)
    assert (ended.status, ended.worker_id) == (final, None)
    assert (ended.steps_done, ended.last_state_step) == (
        {"pause": 1, "cancel": 3}[request_action],
        1,
    )


async def test_jobs_that_should_not_run_are_not_claimed(session, job):
    await apply_action(session, job.id, JobAction.pause)
    assert await claim_job(session, job.id, "w1", heartbeat_timeout=0) is None
    assert await claim_job(session, 10**9, "w1", heartbeat_timeout=0) is None


async def test_heartbeat_and_steps_report_the_requested_action(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    assert await heartbeat(session, job.id, "w1") is None
    await apply_action(session, job.id, JobAction.pause)
    assert await heartbeat(session, job.id, "w1") is JobAction.pause
    assert await record_step(session, job.id, "w1", 0, {"m": 1.0}) is JobAction.pause


async def test_complete_records_the_final_weights(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await apply_action(session, job.id, JobAction.pause)
    done = await complete_job(session, job.id, "w1", "/w/final")
    assert done.status == JobStatus.succeeded, "a pause asked for after the last step is moot"
    assert (done.final_weights_path, done.steps_done) == ("/w/final", 3)
    assert done.finished_at is not None and done.requested_action is None
    with pytest.raises(JobNotHeld):
        await fail_job(session, job.id, "w1", "late", "too late")


async def test_a_cancel_accepted_after_the_last_step_ends_cancelled(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await apply_action(session, job.id, JobAction.cancel)
    done = await complete_job(session, job.id, "w1", "/w/final")
    assert done.status == JobStatus.cancelled, "an accepted cancel never ends succeeded"
    assert (done.final_weights_path, done.steps_done) == ("/w/final", 3), "weights kept"
    assert done.requested_action is None


async def test_fail_keeps_a_code_and_message(session, job):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    failed = await fail_job(session, job.id, "w1", "tokenizer_mismatch", "different vocabularies")
    assert failed.status == JobStatus.failed
    assert failed.error == {"code": "tokenizer_mismatch", "message": "different vocabularies"}
    last = (
        await session.execute(
            select(Event.level).where(Event.job_id == job.id).order_by(Event.id.desc()).limit(1)
        )
    ).scalar()
    assert last == "error"


@pytest.mark.parametrize(
    ("request_action", "final"), [(None, S.queued), ("cancel", S.cancelled), ("pause", S.paused)]
)
async def test_stop_follows_the_request(session, job, request_action, final):
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    if request_action:
        await apply_action(session, job.id, JobAction(request_action))
    stopped = await stop_job(
        session, job.id, "w1", reason="worker shutting down", state_path="/s/2", state_step=2
    )
    assert stopped.status == final
    assert (stopped.last_state_path, stopped.last_state_step) == ("/s/2", 2)
    assert stopped.worker_id is None
    if final is S.queued:
        assert stopped.queue_reason == "worker shutting down"
        again = await claim_job(session, job.id, "w2", heartbeat_timeout=60)
        assert (again.attempts, again.steps_done) == (2, 2)


async def test_every_transition_leaves_an_event(session, job):
    await apply_action(session, job.id, JobAction.pause)
    await apply_action(session, job.id, JobAction.pause)
    await apply_action(session, job.id, JobAction.resume)
    await claim_job(session, job.id, "w1", heartbeat_timeout=60)
    await apply_action(session, job.id, JobAction.cancel)
    await stop_job(session, job.id, "w1", reason="stop")
    assert await events_of(session, job.id) == [
        "Job created",
        "Paused while queued",
        "Resumed; waiting for a worker",
        "Attempt 1 started on w1",
        "Cancel requested; the worker stops at the next step boundary",
        "Cancelled at a step boundary",
    ]


async def test_a_claim_its_worker_never_received_goes_back_to_the_queue(session, job):
    """A database restart dropped the claim's answer after its commit: the worker runs no
    slot of the job, and sends it back itself before anyone would take it over."""
    ONE, TWO = f"w-{uuid.uuid4().hex}", f"w-{uuid.uuid4().hex}"  # the database is shared
    claimed = await claim_job(session, job.id, ONE, heartbeat_timeout=60)
    assert await release_unrun(session, ONE, {job.id}, older_than=0) == [], "a slot runs it"
    assert await release_unrun(session, TWO, set(), older_than=0) == [], "not w2's"
    assert await release_unrun(session, ONE, set(), older_than=60) == [], "claimed just now"
    assert await release_unrun(session, ONE, set(), older_than=0) == [job.id]
    again = await get_job(session, job.id)
    assert (again.status, again.worker_id, again.attempts) == (S.queued, None, claimed.attempts)
    assert "claim never reached its worker" in (await events_of(session, job.id))[-1]
    started = await claim_job(session, job.id, TWO, heartbeat_timeout=60)
    assert started.attempts == 2 and "Attempt 2 started" in (await events_of(session, job.id))[-1]


async def test_an_unreceived_claim_of_a_job_asked_to_pause_is_paused(session, job):
    ONE = f"w-{uuid.uuid4().hex}"
    await claim_job(session, job.id, ONE, heartbeat_timeout=60)
    await apply_action(session, job.id, JobAction.pause)
    assert await release_unrun(session, ONE, set(), older_than=0) == []
    assert (await get_job(session, job.id)).status == S.paused
