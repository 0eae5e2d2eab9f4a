"""The one way a spec becomes a job: `admit`. Every road in passes it, so every road keeps
the same rules: `POST /v1/jobs`, a clone, the dashboard's new-job form, a sweep's base and
each of its grid points (else each listed value and range end) when it is created, and
each trial as the controller inserts it. Its rules are two ordered lists, read top to
bottom below: NAME_RULES (the spec and the settings only) then TEAM_RULES (the team's rows
in the database), each rule in the module that owns what it checks. An `init_from`'s path
is filled by the service from its `{job, checkpoint}`, never taken from a request; the
worker and the playground run the weights rule again before they load anything.

A refusal is SpecRefused (the field and why); each door words it its own way: the API as a
422 naming `param`, the dashboard at the field of its form, the controller as a failed
trial. A sweep is admitted whole by `admit_sweep`: its size bounded, no parameter under an
`init_from` but its job and checkpoint, then every probe, parsed off the event loop and
checked against the database once per distinct set of weights and files it names.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings
from app.jobs.continuation import fill_init_from
from app.jobs.errors import SpecRefused
from app.jobs.stored import fill_stored
from app.jobs.uploads import fill_files
from app.jobs.weight_paths import weights_admitted
from kernel.datapaths import DataPathError, confine_data_path
from kernel.spec import JobSpec, SpecError
from kernel.spec.checks import (
    model_name_refusals,
    unlisted_teacher_server,
    unlisted_tracker,
    unserved_vllm_student,
    vllm_rank_refusal,
)

__all__ = ["SpecRefused", "admit"]

TRACKER = "trackers.mlflow.tracking_uri"

WEIGHTS_FIELDS = {"base_model", "lora_rank", "model_path", "init_from"}


async def admit(session: AsyncSession, team_id: int, spec: JobSpec, settings: Settings) -> JobSpec:
    """`spec` as a job of team `team_id` may be stored: every rule below passed in order,
    its init_from paths and files filled from the team's; SpecRefused naming the field for
    the first thing the team may not submit."""
    check_names(spec, settings)
    return await with_weights(session, team_id, spec, settings)


def files_under_data_root(spec: JobSpec, settings: Settings) -> None:
    """Dataset files lie under the data root (kernel/datapaths.py)."""
    for field, path in spec.dataset_files():
        try:
            confine_data_path(path, settings.data_root)
        except DataPathError as error:
            raise SpecRefused(field, str(error)) from None


def listed_tracker(spec: JobSpec, settings: Settings) -> None:
    """An MLflow tracker is one the operator listed (OPD_MLFLOW_TRACKING_URIS)."""
    if refusal := unlisted_tracker(spec, settings.mlflow_tracking_uris):
        raise SpecRefused(TRACKER, refusal)


def listed_teacher_server(spec: JobSpec, settings: Settings) -> None:
    """A teacher server is one the operator listed (OPD_TEACHER_SERVERS)."""
    if refusal := unlisted_teacher_server(spec, settings.teacher_servers):
        raise SpecRefused(*refusal)


def served_vllm_student(spec: JobSpec, settings: Settings) -> None:
    """`sampling.engine: vllm` has a server for the student (OPD_VLLM_SERVERS) that loads
    adapters of its rank (OPD_VLLM_MAX_LORA_RANKS)."""
    if refusal := unserved_vllm_student(spec, settings.vllm_servers):
        raise SpecRefused("sampling.engine", refusal)
    if refusal := vllm_rank_refusal(spec, settings.vllm_max_lora_ranks):
        raise SpecRefused("student.lora_rank", refusal)


def loadable_model_names(spec: JobSpec, settings: Settings) -> None:
    """Each model name is one its backend can load: a preset, a hub id or a path
    (kernel/model_names.py)."""
    if refusals := model_name_refusals(spec):
        raise SpecRefused(*refusals[0])


NameRule = Callable[[JobSpec, Settings], None]
TeamRule = Callable[[AsyncSession, int, JobSpec, Settings], Awaitable[JobSpec]]

NAME_RULES: tuple[NameRule, ...] = (
    files_under_data_root,
    listed_tracker,
    listed_teacher_server,
    served_vllm_student,
    loadable_model_names,
)
"""The rules that read the spec and the settings only, in order (a sweep's probes run them
in a thread)."""

TEAM_RULES: tuple[TeamRule, ...] = (
    fill_init_from,  # app/jobs/continuation.py: an init_from names a job of the team
    weights_admitted,  # app/jobs/weight_paths.py: saved weights, model paths, local folders
    fill_files,  # app/jobs/uploads.py: an uploaded file is one of the team's
    fill_stored,  # app/jobs/stored.py: stored completions are the team's
)
"""The rules that ask the database about the team, in order; each returns the spec with
what it filled in."""


def check_names(spec: JobSpec, settings: Settings) -> None:
    """The rules that need no database, in order."""
    for rule in NAME_RULES:
        rule(spec, settings)


async def with_weights(
    session: AsyncSession, team_id: int, spec: JobSpec, settings: Settings
) -> JobSpec:
    """`spec` through the team's rules, in order, with what they filled in."""
    for rule in TEAM_RULES:
        spec = await rule(session, team_id, spec, settings)
    return spec


def problems_of(error: SpecError, prefix: str) -> SpecRefused:
    """A spec's validation problems as one refusal naming the first, under `prefix`."""
    if not error.problems:
        return SpecRefused(prefix, str(error))
    (first, message), *rest = error.problems
    more = "".join(f"; {prefix}.{path}: {text}" for path, text in rest)
    return SpecRefused(f"{prefix}.{first}", message + more)


def database_named(spec: JobSpec) -> str:
    """What of a spec the rules that ask the database read (the backend; each model's
    names, paths and init_from; each file dataset and stored completions' filter), by the
    field it is written at: specs alike in it pass or fail alike."""
    models = {
        spec.teacher_field(name): teacher.model_dump(mode="json", include=WEIGHTS_FIELDS)
        for name, teacher in spec.teacher_specs().items()
    }
    models["student"] = spec.student.model_dump(mode="json", include=WEIGHTS_FIELDS)
    read = [*spec.file_datasets(), *spec.stored_datasets()]
    files = {at: dataset.model_dump(mode="json") for at, dataset in read}
    return json.dumps([spec.backend, models, files], sort_keys=True)
