"""Queries and writes of the files table; rows, never response bodies."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import detach
from app.files.errors import FileNotFound
from app.files.schemas import public_id
from app.files.tables import UploadedFile


async def get_file(session: AsyncSession, file_id: int, team_id: int | None) -> UploadedFile:
    """The file; `team_id` None means any team (admin). Another team's is FileNotFound."""
    query = select(UploadedFile).where(UploadedFile.id == file_id)
    if team_id is not None:
        query = query.where(UploadedFile.team_id == team_id)
    row = (await session.execute(query)).scalar_one_or_none()
    if row is None:
        raise FileNotFound(f"{public_id(file_id)} not found")
    return detach(session, row)


async def list_files(
    session: AsyncSession, team_id: int | None, after: int | None, limit: int
) -> tuple[list[UploadedFile], int | None]:
    """A page of files, newest first, and the cursor of the next page (None: the last)."""
    query = select(UploadedFile).order_by(UploadedFile.id.desc()).limit(limit + 1)
    if team_id is not None:
        query = query.where(UploadedFile.team_id == team_id)
    if after is not None:
        query = query.where(UploadedFile.id < after)
    rows = [detach(session, row) for row in (await session.execute(query)).scalars()]
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].id if more and rows else None)


async def team_bytes(session: AsyncSession, team_id: int) -> int:
    """Bytes the team's files hold in the store: each distinct content counted once."""
    distinct = (
        select(UploadedFile.sha256, func.max(UploadedFile.bytes).label("size"))
        .where(UploadedFile.team_id == team_id)
        .group_by(UploadedFile.sha256)
        .subquery()
    )
    total = (await session.execute(select(func.coalesce(func.sum(distinct.c.size), 0)))).scalar()
    return int(total or 0)


async def same_upload(
    session: AsyncSession, team_id: int, sha256: str, field: str | None, answers: str | None
) -> UploadedFile | None:
    """The team's file with these bytes whose fields are those asked for (any, where none
    were given): uploading it again answers with it."""
    query = select(UploadedFile).where(
        UploadedFile.team_id == team_id, UploadedFile.sha256 == sha256
    )
    if field is not None:
        query = query.where(UploadedFile.question_field == field)
    if answers is not None:
        query = query.where(UploadedFile.answer_field == answers)
    row = (await session.execute(query.order_by(UploadedFile.id).limit(1))).scalar_one_or_none()
    return detach(session, row) if row is not None else None


async def keyed_file(session: AsyncSession, team_id: int, key: str | None) -> UploadedFile | None:
    """The team's file that an upload with this Idempotency-Key made (None: no key, or none)."""
    if key is None:
        return None
    query = select(UploadedFile).where(
        UploadedFile.team_id == team_id, UploadedFile.idempotency_key == key
    )
    row = (await session.execute(query)).scalar_one_or_none()
    return detach(session, row) if row is not None else None


async def content_used(session: AsyncSession, sha256: str) -> bool:
    """Whether any file (of any team) still has these bytes."""
    query = select(UploadedFile.id).where(UploadedFile.sha256 == sha256).limit(1)
    return (await session.execute(query)).first() is not None
