"""The fine-tuning doors' use cases over the jobs of the rest of the service: the spec a
create request makes (its training file resolved in the caller's team first; the job is
then submitted through the jobs' one submit use case, so it is admitted, budgeted, audited
and queued as any other), and the team's jobs (those made through any door), their events
and their checkpoints in OpenAI's shapes, each list newest first. A team's key reads them
as it reads them elsewhere (app/jobs/visibility.py): no worker's folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.keys import Principal
from app.auth.tables import Team
from app.curves.tables import StepMetric
from app.files.errors import FileNotFound
from app.files.schemas import row_id
from app.files.store import get_file
from app.files.tables import UploadedFile
from app.fine_tuning.mapping import (
    as_checkpoint,
    as_event,
    as_job,
    hyperparameters_of,
    prompt_count,
    spec_document,
    training_file,
    with_learning_rate,
)
from app.fine_tuning.schemas import (
    FineTuningCheckpoints,
    FineTuningEvents,
    FineTuningJob,
    FineTuningJobCreate,
    FineTuningJobs,
)
from app.jobs.errors import SpecNotFound
from app.jobs.filters import JobFilter
from app.jobs.rows import get_job
from app.jobs.schemas import CheckpointKind, CheckpointPublic, EventPublic, JobPublic
from app.jobs.tables import Checkpoint, Event, Job
from app.jobs.visibility import team_checkpoint, team_event, team_job
from kernel.spec import JobSpec


async def newest_first(
    session: AsyncSession, query: Any, column: Any, after: int | None, limit: int
) -> list[Any]:
    """Up to `limit + 1` rows of `query` (one more says that more follow), newest first,
    those before the row `after`."""
    query = query.order_by(column.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(column < after)
    return list((await session.execute(query)).scalars())


async def spec_for(session: AsyncSession, team_id: int, create: FineTuningJobCreate) -> JobSpec:
    """The spec a create request asks for, its training file the team's (SpecNotFound
    naming `training_file` otherwise; SpecRefused, or pydantic's ValidationError by the
    spec's fields, for a request the spec cannot hold)."""
    try:
        row = await get_file(session, row_id(create.training_file), team_id)
    except FileNotFound:
        raise SpecNotFound(
            "training_file", f"{create.training_file} is not one of your team's files"
        ) from None
    document = spec_document(create, row.report)
    spec = JobSpec.model_validate(document)
    multiplied = with_learning_rate(document, spec, hyperparameters_of(create))
    return spec if multiplied is None else JobSpec.model_validate(multiplied)


def seen_by(job: Job | JobPublic, principal: Principal) -> JobPublic:
    body = job if isinstance(job, JobPublic) else JobPublic.model_validate(job)
    return body if principal.is_admin else team_job(body)


async def as_jobs(session: AsyncSession, bodies: Sequence[JobPublic]) -> list[FineTuningJob]:
    """Jobs in OpenAI's shape, with their teams' names and their training files' prompts."""
    teams = {body.team_id for body in bodies}
    names = dict(
        (await session.execute(select(Team.id, Team.name).where(Team.id.in_(teams)))).all()
    )
    reports = await training_reports(session, bodies)
    answers = []
    for body in bodies:
        name = training_file(body.spec)
        report = None if name is None else reports.get((body.team_id, row_id(name)))
        prompts = None
        if report is not None:
            share = body.spec.dataset_shares()[0]
            prompts = prompt_count(report, share.model_dump(include={"turns", "sample_size"}))
        answers.append(as_job(body, names.get(body.team_id, ""), prompts))
    return answers


async def training_reports(
    session: AsyncSession, bodies: Sequence[JobPublic]
) -> dict[tuple[int, int], dict[str, Any]]:
    """The reports of the jobs' training files, by (team, file), in one read: a file is
    its job's team's."""
    wanted = {
        (body.team_id, row_id(name))
        for body in bodies
        if (name := training_file(body.spec)) is not None
    }
    if not wanted:
        return {}
    query = select(UploadedFile.team_id, UploadedFile.id, UploadedFile.report).where(
        UploadedFile.id.in_({file for _, file in wanted})
    )
    rows = (await session.execute(query)).all()
    return {(team, file): report for team, file, report in rows if (team, file) in wanted}


async def fine_tuning_job(
    session: AsyncSession, principal: Principal, job: Job | JobPublic
) -> FineTuningJob:
    (answer,) = await as_jobs(session, [seen_by(job, principal)])
    return answer


async def jobs_page(
    session: AsyncSession,
    principal: Principal,
    after: int | None,
    limit: int,
    metadata: tuple[tuple[str, str], ...],
) -> FineTuningJobs:
    """The team's jobs (every team's for an admin key), newest first, those after job
    `after`; with `metadata`, those whose spec's metadata holds each pair."""
    query = select(Job).where(*JobFilter(metadata=metadata).where())
    if principal.scope is not None:
        query = query.where(Job.team_id == principal.scope)
    jobs = await newest_first(session, query, Job.id, after, limit)
    answers = await as_jobs(session, [seen_by(job, principal) for job in jobs])
    return FineTuningJobs.of(answers, limit, lambda job: job.id)


async def events_page(
    session: AsyncSession, principal: Principal, job_id: int, after: int | None, limit: int
) -> FineTuningEvents:
    """A job's events, newest first, those before event `after`."""
    job = await get_job(session, job_id, principal.scope)
    query = select(Event).where(Event.job_id == job.id)
    events = [
        EventPublic.model_validate(event)
        for event in await newest_first(session, query, Event.id, after, limit)
    ]
    if not principal.is_admin:
        events = [team_event(event) for event in events]
    return FineTuningEvents.of([as_event(event) for event in events], limit, lambda e: e.id)


async def checkpoints_page(
    session: AsyncSession, principal: Principal, job_id: int, after: int | None, limit: int
) -> FineTuningCheckpoints:
    """A job's saved sampler and final weights (each a model of the chat doors), newest
    first, those before checkpoint `after`, each with the figures of the step that made
    it."""
    job = await get_job(session, job_id, principal.scope)
    kinds = [CheckpointKind.sampler.value, CheckpointKind.final.value]
    query = select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.kind.in_(kinds))
    saved = [
        CheckpointPublic.model_validate(row)
        for row in await newest_first(session, query, Checkpoint.id, after, limit)
    ]
    if not principal.is_admin:
        saved = [team_checkpoint(checkpoint) for checkpoint in saved]
    steps = {checkpoint.step - 1 for checkpoint in saved}
    figures = dict(
        (
            await session.execute(
                select(StepMetric.step, StepMetric.metrics).where(
                    StepMetric.job_id == job.id, StepMetric.step.in_(steps)
                )
            )
        ).all()
    )
    answers = [
        as_checkpoint(job_id, checkpoint, figures.get(checkpoint.step - 1) or {})
        for checkpoint in saved
    ]
    return FineTuningCheckpoints.of(answers, limit, lambda checkpoint: checkpoint.id)
