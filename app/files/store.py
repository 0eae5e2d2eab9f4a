"""Queries and writes of the files table; rows, never response bodies."""

from __future__ import annotations

from sqlalchemy import func, select, update
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
    session: AsyncSession,
    team_id: int | None,
    after: int | None,
    limit: int,
    *,
    oldest_first: bool = False,
    purpose: str | None = None,
) -> list[UploadedFile]:
    """Up to `limit + 1` files after the file `after`, newest first (or oldest): the extra
    one says that more follow. `purpose`: only the files uploaded for it."""
    order = UploadedFile.id.asc() if oldest_first else UploadedFile.id.desc()
    query = select(UploadedFile).order_by(order).limit(limit + 1)
    if team_id is not None:
        query = query.where(UploadedFile.team_id == team_id)
    if after is not None:
        query = query.where(UploadedFile.id > after if oldest_first else UploadedFile.id < after)
    if purpose is not None:
        query = query.where(UploadedFile.purpose == purpose)
    return [detach(session, row) for row in (await session.execute(query)).scalars()]


async def keep_purpose(session: AsyncSession, row: UploadedFile, purpose: str) -> UploadedFile:
    """The file just uploaded, with the purpose its form gave (known once its bytes were
    read: a form may send it after the file)."""
    if row.purpose == purpose:
        return row
    await session.execute(
        update(UploadedFile).where(UploadedFile.id == row.id).values(purpose=purpose)
    )
    await session.commit()
    row.purpose = purpose  # detached: nothing more is written
    return row


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
