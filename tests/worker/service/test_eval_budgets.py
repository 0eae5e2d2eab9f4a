"""An eval is a unit of spending as a step is (issue 47 item 5), on SQLite and Postgres: a
job asks its team's budget before each eval for the eval's most, and skips one that does
not fit (an event says so) instead of running it ungated before step one; an eval that
fits runs."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.budgets.rules import BUDGET_STOP, Limit
from app.budgets.store import put_budget
from app.core.tables import utcnow
from app.jobs.rows import get_job
from app.jobs.store import create_job
from app.jobs.tables import Event
from kernel.spec import JobSpec
from tests.worker.service.test_quick import SPEC, pytrio_fake  # noqa: F401 (fixtures)
from worker.service.tasks import WorkerContext, run_job

EVAL = {
    "dataset": {"source": "inline", "prompts": ["What is 2 + 2?", "What is 3 + 3?"]},
    "samples_per_prompt": 8,
    "teacher_baseline": True,
}


@pytest.mark.usefixtures("pytrio_fake")
@pytest.mark.parametrize(("tokens", "status"), [(200, "paused"), (10**6, "succeeded")])
async def test_an_eval_past_what_is_left_is_skipped_and_one_that_fits_runs(
    settings, sessions, queue, key, tokens, status
):
    async with sessions() as session:
        await put_budget(session, key.team.id, Limit(tokens=tokens, cost=None), utcnow())
        spec = JobSpec.model_validate(SPEC | {"eval": EVAL})
        job_id = (await create_job(session, key.team.id, spec)).job.id
    context = WorkerContext(settings, sessions, queue, "worker-1")

    assert await run_job({"opd": context}, job_id) == f"job {job_id}: {status}"

    async with sessions() as session:
        job = await get_job(session, job_id)
        said = list(
            (await session.execute(select(Event.message).where(Event.job_id == job_id))).scalars()
        )
    skipped = [message for message in said if message.startswith("Skipped the eval after step 0")]
    if status == "paused":
        assert job.stop_reason == BUDGET_STOP and job.eval_tokens == 0, said
        assert skipped and "more than the team's budget has left" in skipped[0]
        assert job.sampled_tokens + job.teacher_tokens + job.trained_tokens < 2 * tokens
    else:
        assert not skipped and job.eval_tokens > 0, said
