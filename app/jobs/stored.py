"""Jobs and the stored completions they read: a spec's `dataset.source: stored_completions`
resolved against the caller's team at admission. The filter picks the rows (or, a clone's,
the `ids` it records are read again), and each is filled in as the worker reads it
(`rows`: its conversation, the answer served, the corrections and notes given on it), so
the worker needs no database. `rows` is the service's to fill: one given is refused."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings
from app.jobs.errors import SpecNotFound, SpecRefused
from app.stored_completions.store import feedback_on, named, picked
from app.stored_completions.tables import StoredCompletion
from kernel.spec import JobSpec, StoredCompletionsDataset
from kernel.spec.data import StoredRow


async def fill_stored(
    session: AsyncSession, team_id: int, spec: JobSpec, settings: Settings | None = None
) -> JobSpec:
    """`spec` with each dataset of stored completions read from team `team_id`'s. An
    admission rule (app/jobs/admission.py: TEAM_RULES)."""
    for at, dataset in spec.stored_datasets():
        spec = spec.with_dataset(at, await read_rows(session, team_id, at, dataset))
    return spec


async def read_rows(
    session: AsyncSession, team_id: int, at: str, dataset: StoredCompletionsDataset
) -> StoredCompletionsDataset:
    if dataset.rows is not None:
        raise SpecRefused(f"{at}.rows", "is filled by the service from the filter or ids")
    if dataset.ids is not None:
        found = await named(session, team_id, dataset.ids)
        if missing := [one for one in dataset.ids if one not in found]:
            raise SpecNotFound(
                f"{at}.ids", f"{missing[0]} is not one of your team's stored completions"
            )
        rows = [found[one] for one in dataset.ids]
    else:
        rows = await picked(session, team_id, dataset.filter)
    if not rows:
        raise SpecRefused(
            f"{at}.filter",
            "picks none of your team's stored chat completions (store them with store: true "
            "on /v1/chat/completions; GET /v1/chat/completions lists them)",
        )
    given = await feedback_on(session, rows)
    read = [
        as_row(row, [f.correction for f in given.of(row) if f.correction is not None])
        for row in rows
    ]
    return dataset.model_copy(update={"ids": [row.public_id for row in rows], "rows": read})


def as_row(row: StoredCompletion, feedback: list[str]) -> StoredRow:
    """A stored completion as a job reads it: its conversation, the first choice's answer."""
    return StoredRow(
        id=row.public_id,
        messages=row.request["messages"],
        tools=row.request.get("tools"),
        answer=row.response["choices"][0]["message"]["content"],
        feedback=feedback,
    )
