"""The one way a spec becomes a job: `admit`. Every road in passes it, so every road keeps
the same rules: `POST /v1/jobs`, a clone, the dashboard's new-job form, a sweep's base and
each of its grid points (else each listed value and range end) when it is created, and
each trial as the controller inserts it. It enforces:

- dataset files lie under the data root; an MLflow tracker and a teacher server are ones
  the operator listed;
  a model name is one its backend can load (a preset, a hub id, or a path);
- an `init_from` names a job of the team by `{job, checkpoint}`, and its path is filled by
  the service from them, never taken from a request (app/jobs/continuation.py);
- an uploaded `file` is one of the team's, its stored object filled in (app/jobs/uploads.py);
- weights paths and `base_model` folders follow app/jobs/weight_paths.py (which the worker and
  the playground run again before they load anything).

A refusal is SpecRefused (the field and why); each door words it its own way: the API as a
422 naming `param`, the dashboard at the field of its form, the controller as a failed
trial. A sweep is admitted whole by `admit_sweep`: its size bounded, no parameter under an
`init_from` but its job and checkpoint, then every probe, parsed off the event loop and
checked against the database once per distinct set of weights and files it names.
"""

from __future__ import annotations

import json

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings
from app.jobs.continuation import fill_init_from
from app.jobs.errors import SpecRefused
from app.jobs.uploads import fill_files
from app.jobs.weight_paths import checked_weights
from kernel.datapaths import DataPathError, confine_data_path
from kernel.spec import JobSpec, SpecError
from kernel.spec.checks import model_name_refusals, unlisted_teacher_server, unlisted_tracker

__all__ = ["SpecRefused", "admit"]

TRACKER = "trackers.mlflow.tracking_uri"

WEIGHTS_FIELDS = {"base_model", "lora_rank", "model_path", "init_from"}


async def admit(session: AsyncSession, team_id: int, spec: JobSpec, settings: Settings) -> JobSpec:
    """`spec` as a job of team `team_id` may be stored: its init_from paths filled from the
    team's jobs; SpecRefused naming the field for anything the team may not submit."""
    check_names(spec, settings)
    return await with_weights(session, team_id, spec, settings)


def check_names(spec: JobSpec, settings: Settings) -> None:
    """The rules that need no database: dataset files, MLflow trackers, model names its
    backend can load (kernel/model_names.py)."""
    for field, path in spec.dataset_files():
        try:
            confine_data_path(path, settings.data_root)
        except DataPathError as error:
            raise SpecRefused(field, str(error)) from None
    if refusal := unlisted_tracker(spec, settings.mlflow_tracking_uris):
        raise SpecRefused(TRACKER, refusal)
    if server_refusal := unlisted_teacher_server(spec, settings.teacher_servers):
        raise SpecRefused(*server_refusal)
    if refusals := model_name_refusals(spec):
        raise SpecRefused(*refusals[0])


async def with_weights(
    session: AsyncSession, team_id: int, spec: JobSpec, settings: Settings
) -> JobSpec:
    """`spec` with its init_from paths filled in, once every weights rule passed."""
    spec = await fill_init_from(session, team_id, spec)
    await checked_weights(session, team_id, spec, settings)
    return await fill_files(session, team_id, spec)


def problems_of(error: SpecError, prefix: str) -> SpecRefused:
    """A spec's validation problems as one refusal naming the first, under `prefix`."""
    if not error.problems:
        return SpecRefused(prefix, str(error))
    (first, message), *rest = error.problems
    more = "".join(f"; {prefix}.{path}: {text}" for path, text in rest)
    return SpecRefused(f"{prefix}.{first}", message + more)


def database_named(spec: JobSpec) -> str:
    """What of a spec the rules that ask the database read (the backend; each model's
    names, paths and init_from; each file dataset), by the field it is written at: specs
    alike in it pass or fail alike."""
    models = {
        spec.teacher_field(name): teacher.model_dump(mode="json", include=WEIGHTS_FIELDS)
        for name, teacher in spec.teacher_specs().items()
    }
    models["student"] = spec.student.model_dump(mode="json", include=WEIGHTS_FIELDS)
    files = {at: dataset.model_dump(mode="json") for at, dataset in spec.file_datasets()}
    return json.dumps([spec.backend, models, files], sort_keys=True)
