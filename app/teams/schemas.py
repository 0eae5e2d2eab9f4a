"""TODO docstring."""

from pydantic import BaseModel, ConfigDict, Field

from kernel.json_types import JsonModel


class TeamPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    max_running: int | None = Field(description="The team's own limit; null: the default.")
    max_queued: int | None = Field(description="The team's own limit; null: the default.")
    effective_max_running: int | None = Field(description="The limit in force; null: none.")
    effective_max_queued: int | None = Field(description="The limit in force; null: none.")
    running: int = Field(description="Jobs running (or stopping) now.")
    queued: int = Field(description="Jobs queued now.")


class TeamsList(BaseModel):
    data: list[TeamPublic]


class LimitsUpdate(JsonModel):
    """Only the fields sent change; null puts a limit back to the service's default."""

    model_config = ConfigDict(extra="forbid")

    max_running: int | None = Field(None, ge=1, le=100_000)
    max_queued: int | None = Field(None, ge=1, le=1_000_000)
