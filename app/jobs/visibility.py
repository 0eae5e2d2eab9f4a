"""What a team key reads of a job, its events and checkpoints: never a worker's folder
(the naming rule: kernel/team_view.py).

The worker writes no folder into an event's text, but old rows hold some, and a backend's
error may quote one: event text and data, job errors and webhook payloads are masked as
they are read for a team, so every row stored before this rule is covered too.
"""

from __future__ import annotations

from app.jobs.schemas import CheckpointPublic, EventPublic, JobPublic
from kernel.team_view import masked_data, masked_spec, masked_text, weights_name


def team_job(body: JobPublic) -> JobPublic:
    """A job as a team key sees it."""
    shown = body.model_dump()
    error = shown["error"]
    return JobPublic.model_validate(
        shown
        | {
            "spec": masked_spec(shown["spec"]),
            "final_weights_path": weights_name(body.final_weights_path),
            "last_state_path": weights_name(body.last_state_path),
            "error": error and {**error, "message": masked_text(error["message"])},
        }
    )


def team_event(event: EventPublic) -> EventPublic:
    return event.model_copy(
        update={"message": masked_text(event.message), "data": masked_data(event.data)}
    )


def team_checkpoint(checkpoint: CheckpointPublic) -> CheckpointPublic:
    return checkpoint.model_copy(update={"path": weights_name(checkpoint.path)})
