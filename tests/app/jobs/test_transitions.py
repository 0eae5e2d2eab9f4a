"""The pure decisions of the state machine: every action from every status, and claims."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.core.tables import utcnow
from app.jobs.errors import IllegalTransition
from app.jobs.schemas import JobAction, JobStatus
from app.jobs.tables import Job
from app.jobs.transitions import plan_action, plan_claim

S = JobStatus
ILLEGAL = IllegalTransition

PLANS = {
    JobAction.cancel: {
        S.queued: S.cancelled,
        S.running: S.cancelling,
        S.pausing: S.cancelling,
        S.paused: S.cancelled,
        S.cancelling: None,
        S.cancelled: None,
        S.succeeded: ILLEGAL,
        S.failed: ILLEGAL,
    },
    JobAction.pause: {
        S.queued: S.paused,
        S.running: S.pausing,
        S.pausing: None,
        S.paused: None,
        S.cancelling: ILLEGAL,
        S.cancelled: ILLEGAL,
        S.succeeded: ILLEGAL,
        S.failed: ILLEGAL,
    },
    JobAction.resume: {
        S.queued: None,
        S.running: None,
        S.pausing: S.running,
        S.paused: S.queued,
        S.cancelling: ILLEGAL,
        S.cancelled: ILLEGAL,
        S.succeeded: ILLEGAL,
        S.failed: ILLEGAL,
    },
}


@pytest.mark.parametrize(
    ("action", "status", "expected"),
    [(a, s, e) for a, table in PLANS.items() for s, e in table.items()],
)
def test_plan_action_covers_every_status(action, status, expected):
    assert set(PLANS[action]) == set(JobStatus)
    if expected is ILLEGAL:
        with pytest.raises(IllegalTransition, match=r"cannot|already"):
            plan_action(action, status)
    elif expected is None:
        assert plan_action(action, status) is None
    else:
        assert plan_action(action, status).target == expected


def a_job(status: JobStatus, **fields) -> Job:
    return Job(team_id=1, name="j", spec={}, total_steps=3, status=status, **fields)


def test_a_claim_starts_queued_jobs_and_takes_over_only_silent_ones():
    now = utcnow()
    start = plan_claim(a_job(S.queued, attempts=1), "w2", heartbeat_timeout=60, now=now)
    assert start.target is S.running
    assert (start.values["attempts"], start.values["worker_id"]) == (2, "w2")

    beat = now - timedelta(seconds=10)
    alive = a_job(S.running, attempts=1, worker_id="w1", heartbeat_at=beat, last_state_step=4)
    assert plan_claim(alive, "w2", heartbeat_timeout=60, now=now) is None
    takeover = plan_claim(alive, "w2", heartbeat_timeout=5, now=now)
    assert takeover.target is S.running and takeover.values["steps_done"] == 4
    assert "w1 stopped sending heartbeats" in takeover.message
    assert plan_claim(a_job(S.succeeded), "w2", heartbeat_timeout=0, now=now) is None
    assert plan_claim(a_job(S.paused), "w2", heartbeat_timeout=0, now=now) is None


def test_a_pause_its_dead_worker_left_takes_effect_at_the_last_saved_state():
    """What a resume goes on from: steps after it are done again (the chaos soak's budget
    job paused at step 4 with no state saved, when Postgres was away past the timeout)."""
    now, beat = utcnow(), utcnow() - timedelta(seconds=10)
    for state, steps_done in ((None, 0), (2, 2)):
        pausing = a_job(
            S.pausing, worker_id="w1", heartbeat_at=beat, steps_done=4, last_state_step=state
        )
        paused = plan_claim(pausing, "w2", heartbeat_timeout=5, now=now)
        assert paused.target is S.paused and paused.values["steps_done"] == steps_done
        assert paused.values["worker_id"] is None and paused.values["heartbeat_at"] is None
        assert f"Paused at step {steps_done}" in paused.message
