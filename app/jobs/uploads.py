"""Jobs and the files they read: a spec's `file: file-12` resolved against the caller's
team at admission (the stored object's hash and format filled in as `blob`, and the
fields its upload found where the spec gives none), and a file refused deletion while an
unfinished job reads it.

Another team's file reads as no file at all (a 404 naming the field); `blob` is the
service's to fill, so one given is refused, and a clone or a sweep's trial (which start
from `continuation.editable`) is resolved again.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.keys import Principal
from app.core.config import Settings
from app.files.claims import lock_team_files
from app.files.errors import FileInUse, FileNotFound
from app.files.schemas import public_id, row_id
from app.files.service import delete_file, unlist_file
from app.files.store import get_file
from app.files.tables import UploadedFile
from app.jobs.errors import SpecNotFound, SpecRefused
from app.jobs.schemas import TERMINAL_STATUSES
from app.jobs.tables import Job
from kernel.spec import FileDataset, JobSpec, stored_spec
from kernel.storage.blobs import Storage


async def fill_files(
    session: AsyncSession, team_id: int, spec: JobSpec, settings: Settings | None = None
) -> JobSpec:
    """`spec` with each uploaded file it names resolved in team `team_id`'s files, and an
    eval that asks a file for more held-out rows than it has refused (its rows are known).
    An admission rule (app/jobs/admission.py: TEAM_RULES)."""
    for at, dataset in spec.file_datasets():
        if dataset.file is None:
            continue
        if dataset.blob is not None:
            raise SpecRefused(f"{at}.blob", "is filled by the service from file")
        row = await team_file(session, team_id, at, dataset)
        filled = resolved(at, dataset, row)
        if at != "eval.dataset" and spec.eval is not None and spec.eval.holdout:
            check_holdout(spec.eval.holdout, filled, row)
        spec = spec.with_dataset(at, filled)
    return spec


async def team_file(
    session: AsyncSession, team_id: int, at: str, dataset: FileDataset
) -> UploadedFile:
    """The team's file the dataset at `at` names; SpecNotFound naming its field."""
    assert dataset.file is not None
    try:
        return await get_file(session, row_id(dataset.file), team_id)
    except FileNotFound:
        raise SpecNotFound(
            f"{at}.file", f"{dataset.file} is not one of your team's files"
        ) from None


async def files_kept(session: AsyncSession, team_id: int, spec: JobSpec) -> None:
    """After the job's row is written (SQLite's one writer held), under the team's files
    lock a delete takes: each file the spec reads is still there. A delete racing the
    submission either ran first (this SpecNotFound, the caller rolls back) or finds the
    job (its 409)."""
    await lock_team_files(session, team_id)
    for at, dataset in spec.file_datasets():
        if dataset.file is not None:
            await team_file(session, team_id, at, dataset)


async def check_same_bytes(session: AsyncSession, team_id: int, job: Job, spec: JobSpec) -> None:
    """A clone of `job` reads the bytes it trained on: each of `spec`'s datasets naming
    the file the job's dataset there named must still hold the object the job read
    (`blob`), else SpecRefused: a file's id never names other bytes (ids are never reused
    and a file is never rewritten), and this keeps it so for the clone whatever happens."""
    trained = {at: d for at, d in stored_spec(job.spec).file_datasets() if d.blob is not None}
    for at, dataset in spec.file_datasets():
        before = trained.get(at)
        if before is None or dataset.file != before.file:
            continue
        row = await team_file(session, team_id, at, dataset)
        if f"{row.sha256}.{row.format}" != before.blob:
            raise SpecRefused(
                f"{at}.file",
                f"{dataset.file} holds other bytes than job {job.id} trained on: name the "
                "file to read in the patch",
            )


def check_holdout(holdout: int, dataset: FileDataset, row: UploadedFile) -> None:
    """The worker draws `eval.holdout` prompts from the rows outside the training pool
    (`sample_size` of them, else every row): refused now where the file's rows cannot give
    them, instead of failing the job in the worker (`bad_eval`)."""
    usable = row.rows - (
        row.report.get("empty_questions", 0) if dataset.field == row.question_field else 0
    )
    pool = min(dataset.sample_size or usable, usable)
    if usable - pool >= holdout:
        return
    hint = (
        f"set dataset.sample_size to at most {usable - holdout}"
        if usable > holdout
        else "give eval a dataset of its own"
    )
    raise SpecRefused(
        "eval.holdout",
        f"asks for {holdout} prompts but {dataset.file} has {usable - pool} rows outside the "
        f"training pool ({usable} usable rows, {pool} of them in the pool): {hint}",
    )


def resolved(at: str, dataset: FileDataset, row: UploadedFile) -> FileDataset:
    """The dataset with its file's stored object, and the columns its upload found where it
    names none (a file of conversations: always its own, which its rows' shape says)."""
    given = dataset.model_fields_set
    field = dataset.field if "field" in given else row.question_field
    answers = dataset.answer_field if "answer_field" in given else row.answer_field
    if row.report.get("chat") is not None:
        for param, column, own in (
            ("field", field, row.question_field),
            ("answer_field", answers, row.answer_field),
        ):
            if column != own:
                raise SpecRefused(
                    f"{at}.{param}",
                    f"{dataset.file} holds conversations, whose prompts and answers its rows' "
                    "shape says: leave field and answer_field out",
                )
    columns = {column["name"]: column["type"] for column in row.report["columns"]}
    for param, column in (("field", field), ("answer_field", answers)):
        if column is not None and column not in columns:
            raise SpecRefused(
                f"{at}.{param}",
                f"{dataset.file} has no column {column!r}; its columns: {', '.join(columns)}",
            )
    blob = f"{row.sha256}.{row.format}"
    return dataset.model_copy(update={"blob": blob, "field": field, "answer_field": answers})


async def jobs_reading(session: AsyncSession, team_id: int, file_id: int) -> list[int]:
    """The team's unfinished jobs whose spec reads the file."""
    query = select(Job.id, Job.spec).where(
        Job.team_id == team_id, Job.status.not_in([status.value for status in TERMINAL_STATUSES])
    )
    name = public_id(file_id)
    rows = (await session.execute(query.order_by(Job.id))).all()
    return [job_id for job_id, spec in rows if name in stored_spec(spec).uploaded_files()]


async def remove_file(
    session: AsyncSession, principal: Principal, storage: Storage, file_id: int
) -> None:
    """Delete the caller's file; FileInUse while an unfinished job of its team reads it."""
    row = await get_file(session, file_id, principal.scope)
    await unlist_file(session, row)  # under the lock admission takes (files_kept)
    if readers := await jobs_reading(session, row.team_id, file_id):
        await session.rollback()
        named = ", ".join(f"job {job_id}" for job_id in readers[:10])
        raise FileInUse(
            f"{public_id(file_id)} is read by unfinished jobs ({named}); delete it once they end"
        )
    await delete_file(session, principal, storage, row)
