"""What the job store refuses, each a different answer for the API or the worker."""

from __future__ import annotations

from dataclasses import dataclass


class JobNotFound(LookupError):
    """No job with this id (or none the caller may see)."""


class IllegalTransition(Exception):
    """The job's current status does not allow the change; the message says why."""


class JobNotHeld(Exception):
    """The worker no longer holds this job: another worker took it over, or it ended."""


@dataclass
class SpecRefused(Exception):
    """A field of a submitted spec the service refuses (a 422 naming it)."""

    param: str
    message: str

    def __str__(self) -> str:
        return f"{self.param}: {self.message}"


class SpecNotFound(SpecRefused):
    """A spec names something that is not the caller's team's (a 404 naming the field: the
    answer is the same whether it exists elsewhere or nowhere)."""
