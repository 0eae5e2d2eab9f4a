"""What a job list is filtered by, the same for the API's `GET /v1/jobs` and the dashboard's
table (and so for the SDK's `jobs.list` and `opd jobs list`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func

from app.jobs.schemas import JobStatus
from app.jobs.tables import Job


@dataclass(frozen=True)
class JobFilter:
    status: JobStatus | None = None
    name: str = ""
    """Any part of the name, ignoring case."""
    sweep: int | None = None
    """Only the trials of this sweep."""
    metadata: tuple[tuple[str, str], ...] = ()
    """Labels the spec's `metadata` must hold, each `key` with exactly `value`."""

    def where(self) -> list[ColumnElement[bool]]:
        clauses: list[ColumnElement[bool]] = []
        if self.status is not None:
            clauses.append(Job.status == self.status)
        if self.name:
            clauses.append(func.lower(Job.name).contains(self.name.lower(), autoescape=True))
        if self.sweep is not None:
            clauses.append(Job.sweep_id == self.sweep)
        spec: Any = Job.spec
        for key, value in self.metadata:
            clauses.append(spec["metadata"][key].as_string() == value)
        return clauses
