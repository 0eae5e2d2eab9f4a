"""Sweeps as they are asked for and shown: the definition, the trials, the best one."""

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from app.core.pages import Page
from app.jobs.schemas import JobStatus
from kernel.json_types import JsonModel
from kernel.spec import JobSpec
from kernel.spec.base import field_error

MAX_TRIALS = 200

MAX_PARAMETERS = 16

MAX_VALUES = 100

ParameterValue = bool | int | float | str

SweepName = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]

DottedPath = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[a-z_]+(\.[a-z_0-9]+)+$")
]


class SweepStatus(StrEnum):
    running = "running"
    completed = "completed"
    cancelled = "cancelled"
    failed = "failed"


class SweepMethod(StrEnum):
    grid = "grid"
    random = "random"
    tpe = "tpe"


class Parameter(JsonModel):
    """One dimension of the search: a list of `values`, or a range (`min`, `max`) drawn
    from a distribution (random and tpe only). Numbers are finite (JSON has no others)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    values: list[ParameterValue] | None = Field(None, min_length=1, max_length=MAX_VALUES)
    min: float | None = None
    max: float | None = None
    distribution: Literal["uniform", "log_uniform", "int_uniform"] = "uniform"

    @model_validator(mode="after")
    def _values_or_range(self) -> "Parameter":
        if (self.values is None) == (self.min is None or self.max is None):
            raise ValueError("give either values: [...] or both min and max")
        if self.values is not None:
            if self.min is not None or self.max is not None:
                raise ValueError("give either values: [...] or min and max, not both")
            return self
        assert self.min is not None and self.max is not None
        if self.min >= self.max:
            raise ValueError("min must be below max")
        if self.distribution == "log_uniform" and self.min <= 0:
            raise ValueError("a log_uniform range needs min > 0")
        if self.distribution == "int_uniform" and not (
            self.min.is_integer() and self.max.is_integer()
        ):
            raise ValueError("an int_uniform range needs whole min and max")
        return self


class SweepMetric(JsonModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, description="Any step metric's name.")
    goal: Literal["minimize", "maximize"]


class EarlyStop(JsonModel):
    """Stop a running trial whose metric at a rung is among the losers at that step:
    `asha` keeps the best 1/eta of the trials at rungs min_steps * eta^k; `median` stops a
    trial worse than the median of the others at every multiple of min_steps."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["asha", "median"]
    min_steps: int = Field(ge=1, le=100_000)
    eta: int = Field(3, ge=2, le=100, description="ASHA's reduction factor.")


class SweepCreate(JsonModel):
    """A search over a job spec: trials are jobs whose spec is `base` (or `base_job`'s
    spec) with each parameter's value at its dotted path."""

    model_config = ConfigDict(extra="forbid")

    name: SweepName
    base: dict[str, Any] | None = Field(None, description="A job spec.")
    base_job: int | None = Field(None, ge=1, le=2**31 - 1, description="Or that job's spec.")
    parameters: dict[DottedPath, Parameter] = Field(
        min_length=1,
        max_length=MAX_PARAMETERS,
        json_schema_extra={"additionalProperties": False},  # dotted paths only
    )
    method: SweepMethod = SweepMethod.random
    metric: SweepMetric
    max_trials: int = Field(10, ge=1, le=MAX_TRIALS)
    parallel: int = Field(1, ge=1, le=64, description="Trials queued or running at once.")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    early_stop: EarlyStop | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_a_job_spec(cls, data: Any) -> Any:
        """A job spec sent as a sweep gets one answer saying what a sweep is, not one
        unknown field for each of its groups."""
        if isinstance(data, dict) and not data.keys() & SWEEP_PARTS and data.keys() & JOB_GROUPS:
            raise field_error(("base",), NOT_A_SWEEP)
        return data

    @model_validator(mode="after")
    def _one_base(self) -> "SweepCreate":
        if (self.base is None) == (self.base_job is None):
            raise field_error(("base",), "give either base (a job spec) or base_job (a job id)")
        if self.method is SweepMethod.grid:
            ranged = [path for path, p in self.parameters.items() if p.values is None]
            if ranged:
                raise field_error(
                    ("parameters", ranged[0], "values"),
                    f"a grid needs values for every parameter: {ranged[0]} has none",
                )
        return self


SWEEP_PARTS = {"base", "base_job", "parameters"}
JOB_GROUPS = JobSpec.model_fields.keys() - SweepCreate.model_fields.keys()
NOT_A_SWEEP = (
    "this is a job spec, not a sweep: a sweep needs `base:` (the job spec, indented "
    "under it, or `base_job:` and a job id) and `parameters:` (the dotted spec paths to "
    "search, e.g. `optim.learning_rate: {values: [1.0e-4, 3.0e-4]}`), beside `name:` and "
    "`metric:`; examples/sweep-tiny.yaml is one"
)


class RungPublic(BaseModel):
    step: int = Field(description="The rung.")
    value: float | None = Field(description="The metric there: its last point by that step.")
    kept: bool = Field(description="Whether the trial continued past the rung.")
    competing: int = Field(description="Trials it was judged against there, itself included.")


class TrialPublic(BaseModel):
    number: int
    job_id: int
    status: JobStatus
    values: dict[str, ParameterValue | None] = Field(description="The trial's parameters.")
    metric: float | None = Field(description="The metric's last recorded value.")
    metric_step: int | None = Field(description="The step it was recorded at.")
    best_so_far: float | None = Field(description="The best metric of trials 1..number.")
    steps_done: int
    total_steps: int
    stop_reason: str | None
    judged: RungPublic | None = Field(
        None, description="The last rung early stopping judged it at (once per rung)."
    )


class SweepPublic(BaseModel):
    id: int
    team_id: int
    name: str
    status: SweepStatus
    method: SweepMethod
    metric: SweepMetric
    parameters: dict[str, Parameter]
    max_trials: int
    parallel: int
    seed: int
    early_stop: EarlyStop | None
    base_job: int | None
    base: dict[str, Any] = Field(description="The spec every trial starts from.")
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    trials_planned: int = Field(description="Trials the sweep runs: max_trials, or the grid.")
    trials_created: int
    best: TrialPublic | None = Field(description="The trial with the best metric so far.")
    steps_saved: int = Field(description="Steps early-stopped trials did not run.")


class SweepDetail(SweepPublic):
    trials: list[TrialPublic] = Field(description="By trial number.")


class SweepsPage(Page[SweepPublic]):
    """Newest first; pass `next_cursor` as `after` to get the next page."""
