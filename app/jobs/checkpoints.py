"""A job's saved weights found by what people call them: `final`, or the step they were
saved after. Sampler weights (`sampler`, `final`) are what a playground loads; training
states (`state`) are what another job continues from. A job replayed after a crash may
record a step's checkpoint twice: the newest record wins."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sqlalchemy import distinct, func, select, true
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.tables import Team
from app.jobs.schemas import CheckpointKind, JobStatus
from app.jobs.tables import Checkpoint, Job
from kernel.spec.base import CheckpointRef

SAMPLERS = (CheckpointKind.sampler, CheckpointKind.final)
SHOWN = 3
"""How many of the first and of the last saved steps a message names."""


class CheckpointUnavailable(Exception):
    """The job has no such checkpoint; the message says which ones it has."""


async def newest(
    session: AsyncSession, job_id: int, kinds: Collection[str], step: int | None = None
) -> Checkpoint | None:
    query = select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.kind.in_(kinds))
    if step is not None:
        query = query.where(Checkpoint.step == step)
    return (await session.execute(query.order_by(Checkpoint.id.desc()).limit(1))).scalar()


async def steps_saved(session: AsyncSession, job_id: int, kinds: Collection[str]) -> str:
    """The steps a job saved checkpoints of these kinds after, for a message: every one when
    there are few, else the first and last few and how many (`1, 2, 3, ..., 98, 99, 100
    (100 in all)`). It reads that many rows, however many checkpoints the job saved."""
    scope = (Checkpoint.job_id == job_id) & Checkpoint.kind.in_(kinds)
    steps = select(Checkpoint.step).where(scope).group_by(Checkpoint.step)
    first = (await session.execute(steps.order_by(Checkpoint.step).limit(2 * SHOWN + 1))).scalars()
    head = list(first)
    if len(head) <= 2 * SHOWN:
        return listed(head) or "none yet"
    last = (await session.execute(steps.order_by(Checkpoint.step.desc()).limit(SHOWN))).scalars()
    count = select(func.count(distinct(Checkpoint.step))).where(scope)
    total = (await session.execute(count)).scalar_one()
    return f"{listed(head[:SHOWN])}, ..., {listed(reversed(list(last)))} ({total:,} in all)"


def listed(steps: Iterable[int]) -> str:
    return ", ".join(map(str, steps))


async def sampler_weights(session: AsyncSession, job: Job, ref: CheckpointRef) -> Checkpoint:
    """The sampler weights a playground loads: the final ones, or those saved after a step."""
    if ref == "final":
        found = await newest(session, job.id, [CheckpointKind.final])
    else:
        found = await newest(session, job.id, SAMPLERS, ref)
    if found is not None:
        return found
    what = "final weights" if ref == "final" else f"sampler weights saved after step {ref}"
    raise CheckpointUnavailable(
        f"job {job.id} ({job.status}) has no {what}; it saved sampler weights after steps: "
        f"{await steps_saved(session, job.id, SAMPLERS)}"
    )


async def training_state(session: AsyncSession, job: Job, ref: CheckpointRef) -> Checkpoint:
    """The state another job continues from: the one saved when the job succeeded
    (`final`), or the one saved after a step."""
    final = ref == "final"
    step = job.total_steps if final else ref
    succeeded = job.status == JobStatus.succeeded
    if not final or succeeded:
        found = await newest(session, job.id, [CheckpointKind.state], step)
        if found is not None:
            return found
    if final and not succeeded:
        reason = f"has no final state: it has not succeeded (it is {job.status})"
    elif final:
        reason = "has no final state (it ended before jobs saved one)"
    else:
        reason = f"saved no training state after step {step}"
    states = await steps_saved(session, job.id, [CheckpointKind.state])
    raise CheckpointUnavailable(f"job {job.id} {reason}; it saved states after steps: {states}")


async def job_checkpoint(session: AsyncSession, job_id: int, checkpoint_id: int) -> Checkpoint:
    """Checkpoint `checkpoint_id` of job `job_id` (CheckpointUnavailable if not its)."""
    query = select(Checkpoint).where(Checkpoint.id == checkpoint_id, Checkpoint.job_id == job_id)
    found = (await session.execute(query)).scalar()
    if found is None:
        raise CheckpointUnavailable(f"job {job_id} has no checkpoint {checkpoint_id}")
    return found


async def saved_samplers(
    session: AsyncSession, team_id: int | None, after: tuple[int, int] | None, limit: int
) -> tuple[dict[int, str], list[Checkpoint]]:
    """What the first `limit` names of a job's sampler weights after `after` can come from,
    the names sorted newest job first, then by step (`after` = a job and a step; a step
    before 0 lists the job's every step). The team's (None: every team's) newest `limit +
    1` jobs with sampler weights from `after`'s job down, each with its team's name; each
    one's newest final weights; and the newest record of each of the first `limit` steps
    saved after `after`. It reads that many rows, however many checkpoints the jobs saved."""
    scope = Checkpoint.kind.in_(SAMPLERS)
    if team_id is not None:
        scope &= Job.team_id == team_id
    upto = Checkpoint.job_id <= after[0] if after is not None else true()
    jobs = (
        await session.execute(
            select(Checkpoint.job_id, Team.name)
            .join(Job, Job.id == Checkpoint.job_id)
            .join(Team, Team.id == Job.team_id)
            .where(scope, upto)
            .group_by(Checkpoint.job_id, Team.name)
            .order_by(Checkpoint.job_id.desc())
            .limit(limit + 1)
        )
    ).all()
    if not jobs:
        return {}, []
    in_range = scope & upto & (Checkpoint.job_id >= jobs[-1][0])
    later = (
        true() if after is None else (Checkpoint.job_id < after[0]) | (Checkpoint.step > after[1])
    )
    steps = (
        select(func.max(Checkpoint.id))
        .join(Job, Job.id == Checkpoint.job_id)
        .where(in_range, later)
        .group_by(Checkpoint.job_id, Checkpoint.step)
        .order_by(Checkpoint.job_id.desc(), Checkpoint.step)
        .limit(limit)
    )
    finals = (
        select(func.max(Checkpoint.id))
        .join(Job, Job.id == Checkpoint.job_id)
        .where(in_range, Checkpoint.kind == CheckpointKind.final)
        .group_by(Checkpoint.job_id)
    )
    found = await session.execute(
        select(Checkpoint).where(Checkpoint.id.in_(steps) | Checkpoint.id.in_(finals))
    )
    return dict(jobs), list(found.scalars())
