"""Checkpoints as the API shows them, and their kinds."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from app.core.pages import Page


class CheckpointKind(StrEnum):
    state = "state"
    sampler = "sampler"
    final = "final"


class CheckpointPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    step: int
    kind: CheckpointKind
    path: str
    created_at: datetime


class CheckpointsPage(Page[CheckpointPublic]):
    """Oldest first; pass `next_cursor` as `after` to get the next page."""
