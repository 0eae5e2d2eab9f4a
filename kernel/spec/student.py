"""The student: the model trained, its LoRA, its seed, and where a continued job starts."""

from __future__ import annotations

from pydantic import Field, model_validator

from kernel.spec.base import CheckpointRef, ModelName, SpecModel, field_error


class SavedWeights(SpecModel):
    """Weights a job of the service saved, named by the job and the checkpoint: the API
    checks the job is the caller's team's and fills in where they are."""

    job: int | None = Field(
        None, ge=1, le=2**31 - 1, description="The job that saved them (the service)."
    )
    checkpoint: CheckpointRef = Field(
        "final", description="`final`: saved when that job ended; N: saved after step N."
    )
    path: str | None = Field(
        None,
        max_length=1000,
        description="Where they are: the service fills it from `job` and `checkpoint` (and "
        "refuses one given); `opd run` takes it instead of `job`.",
    )

    @model_validator(mode="after")
    def _names_a_state(self) -> SavedWeights:
        if self.job is None and self.path is None:
            raise field_error(
                ("job",), "init_from needs a job (submitted to the service) or a path"
            )
        return self


class InitFrom(SavedWeights):
    """Where a continued job's student starts: a training state another job saved."""

    with_optimizer: bool = Field(
        False,
        description="Also restore the optimizer (Adam's moments and step count); false = the "
        "weights only, with a fresh optimizer.",
    )


class StudentSpec(SpecModel):
    base_model: ModelName = Field(
        description="A built-in preset (local backend), a hub id (org/name) or, on the local "
        "backend, a model folder."
    )
    lora_rank: int = Field(32, ge=4, le=64, description="PyTRIO accepts 4..64.")
    seed: int = Field(
        42,
        ge=0,
        le=2**31 - 1,
        description="Seeds the LoRA's initial weights and the rollouts' sampling (a resumed "
        "job goes on from its saved state's RNG).",
    )
    init_from: InitFrom | None = Field(
        None, description="Start from another job's saved state instead of a fresh LoRA."
    )
