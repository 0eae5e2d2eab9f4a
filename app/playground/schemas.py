"""The playground's request and what it answers: the completions a checkpoint sampled, each
token scored by the teacher beside the student, and (with `store`) the stored completion
that keeps each model's."""

from __future__ import annotations

from pydantic import Field

from app.jobs.schemas import CheckpointPublic
from app.stored_completions.schemas import Store, StoredMetadata
from kernel.playground import ModelOutput, SampleAnswer, SampleRequest


class PlaygroundRequest(SampleRequest):
    """`POST /v1/jobs/{id}/playground`: what a worker samples (SampleRequest: a worker's
    task carries only its fields), and whether the team keeps the answers, as
    `/v1/chat/completions` keeps one with `store: true`."""

    store: Store = Field(
        False,
        description="Keep each model's completions as a stored completion of the team "
        "(GET /v1/chat/completions lists them under the model's name: job-12, "
        "job-12@step-300, job-12:teacher, job-12:base), within its quota "
        "(OPD_TEAM_MAX_STORED_COMPLETIONS): one per model asked for.",
    )
    metadata: StoredMetadata = None


class PlaygroundOutput(ModelOutput):
    stored_completion_id: str | None = Field(
        None,
        description="With `store`: the stored completion that keeps this model's "
        "completions (GET /v1/chat/completions/{id}).",
    )


class PlaygroundAnswer(SampleAnswer):
    outputs: list[PlaygroundOutput]  # type: ignore[assignment]
    job_id: int
    checkpoint: CheckpointPublic = Field(description="The saved weights that were sampled.")
