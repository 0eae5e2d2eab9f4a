"""What every table shares: deterministic constraint names, and timestamps that are
timezone-aware UTC on every database.

Status and kind columns are plain strings (not database enums) so that adding a value
never needs a Postgres type migration."""

import math
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    DateTime,
    TypeDecorator,
)
from sqlmodel import Field, SQLModel

# Deterministic constraint names, so later migrations can alter them on SQLite and Postgres.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


NEVER_REUSED: dict[str, Any] = {"sqlite_autoincrement": True}
"""The options of a table whose ids a team names (a job, a file, a key...): SQLite's
AUTOINCREMENT, so a deleted row's id is never given to another row (a clone naming
file-13 must not read other bytes); Postgres's sequences never go back anyway."""


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python on every database (SQLite stores naive UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are ambiguous; pass an aware UTC datetime")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def timestamp() -> Any:
    return Field(default_factory=utcnow, sa_type=UTCDateTime)


def optional_timestamp() -> Any:
    return Field(default=None, sa_type=UTCDateTime)


def finite_or_none(value: float) -> float | None:
    """JSON (and Postgres) has no NaN or infinity: a non-finite metric is stored as null."""
    value = float(value)
    return value if math.isfinite(value) else None
