"""What the playground answers: the completions a checkpoint sampled, each token scored
by the teacher beside the student."""

from __future__ import annotations

from pydantic import Field

from app.jobs.schemas import CheckpointPublic
from kernel.playground import SampleAnswer


class PlaygroundAnswer(SampleAnswer):
    job_id: int
    checkpoint: CheckpointPublic = Field(description="The saved weights that were sampled.")
