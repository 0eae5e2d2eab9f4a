"""Which weights a job may load, checked against its team when it is submitted and again by
the worker (and the playground) right before anything is loaded.

- Weights this service saved are reached through `student.init_from` / `teacher.init_from`
  (app/jobs/continuation.py), whose paths the service fills; never through a path a team writes.
  An `init_from.path` is loaded only if the database records it for a job of the team.
- A raw `teacher.model_path` that equals or lies under a path the service recorded for
  another team's job (a checkpoint, final weights, a saved state) is refused.
- A path on the local backend (`teacher.model_path`, a `base_model` folder or GGUF file) must
  lie under the data root once every `..` and symlink is followed, and not under the artifact
  root. A `base_model` is a path when it looks like one (`is_model_path`); else a hub id.

A refusal reads the same whatever lies at the path, so it says nothing about other teams'
files or what the workers' disks hold.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings
from app.jobs.continuation import uses
from app.jobs.errors import SpecRefused
from app.jobs.tables import Checkpoint, Job
from kernel.datapaths import DataPathError, confine_data_path, is_model_path
from kernel.spec import JobSpec

MODEL_PATH_RULE = (
    "not weights this team may load by path: give a folder under the server's data root "
    "(local backend) or the backend's URI of weights saved elsewhere; weights a job of your "
    "team saved here are named with teacher.init_from: {job, checkpoint}"
)
BASE_MODEL_RULE = (
    "a model folder or GGUF file must be an absolute path under the server's data root; or give a "
    "built-in preset or a hub id (name or org/name) in the workers' cache"
)
SAVED_WEIGHTS_RULE = (
    "not weights a job of this team saved: name them with init_from: {job, checkpoint}; "
    "the service fills the path"
)


def local_folder(param: str, path: str, settings: Settings, rule: str) -> Path:
    """Where `path` really is, if it is under the data root and not under the artifact
    root; else SpecRefused with `rule`."""
    try:
        resolved = confine_data_path(path, settings.data_root)
    except DataPathError:
        raise SpecRefused(param, rule) from None
    if resolved.is_relative_to(settings.artifact_root.resolve()):
        raise SpecRefused(param, rule)
    return resolved


def uri_and_parents(uri: str) -> list[str]:
    """A backend URI as given, normalised (no `.`, `..` or doubled slashes), and each
    folder above it: what it would lie under."""
    parts = urlsplit(uri)
    if not parts.scheme or not parts.netloc:
        return [uri]
    root = f"{parts.scheme}://{parts.netloc}"
    segments = [s for s in posixpath.normpath("/" + parts.path.lstrip("/")).split("/") if s]
    above = ["".join(f"/{s}" for s in segments[:n]) for n in range(len(segments), -1, -1)]
    return [uri, *(root + path for path in above)]


async def recorded(session: AsyncSession, teams: ColumnElement[bool], paths: list[str]) -> bool:
    """Whether any of `paths` is recorded as saved (a checkpoint, final weights, a saved
    state) by a job of the `teams` clause."""
    saved = (
        select(Checkpoint.id)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(teams, Checkpoint.path.in_(paths))
        .limit(1)
    )
    ended = (
        select(Job.id)
        .where(teams, or_(Job.final_weights_path.in_(paths), Job.last_state_path.in_(paths)))
        .limit(1)
    )
    for query in (saved, ended):
        if (await session.execute(query)).first() is not None:
            return True
    return False


async def checked_weights(
    session: AsyncSession, team_id: int, spec: JobSpec, settings: Settings
) -> JobSpec:
    """`spec` with each teacher's local model_path replaced by where it really is (what the
    backend loads); SpecRefused naming the field when a path breaks a rule above."""
    for use in uses(spec):
        path = use.ref.path if use.ref is not None else None
        if path is not None and not await recorded(session, Job.team_id == team_id, [path]):
            raise SpecRefused(f"{use.field}.path", SAVED_WEIGHTS_RULE)
    if spec.backend == "local":
        local_base_model("student.base_model", spec.student.base_model, settings)
    for name, teacher in spec.teacher_specs().items():
        field = spec.teacher_field(name)
        if teacher.server is not None:  # the server's model names a model there, not here
            if spec.backend == "local" and teacher.server.tokenizer is not None:
                local_base_model(f"{field}.server.tokenizer", teacher.server.tokenizer, settings)
            continue
        if spec.backend == "local":
            local_base_model(f"{field}.base_model", teacher.base_model, settings)
        path = teacher.model_path
        if path is None:
            continue
        if spec.backend == "local":
            folder = local_folder(f"{field}.model_path", path, settings, MODEL_PATH_RULE)
            loaded, candidates = str(folder), [str(folder), *map(str, folder.parents)]
        else:
            loaded, candidates = path, uri_and_parents(path)
        if await recorded(session, Job.team_id != team_id, candidates):
            raise SpecRefused(f"{field}.model_path", MODEL_PATH_RULE)
        spec = spec.with_teacher(name, teacher.model_copy(update={"model_path": loaded}))
    return spec


def written_paths(stored: JobSpec, loaded: JobSpec) -> dict[str, str]:
    """Each folder `checked_weights` resolved for `loaded`, and the `model_path` the team
    wrote for it in `stored`: what errors, events and trackers say instead (a relative path
    is read under the data root, a folder the team's key must not see)."""
    written = stored.teacher_specs()
    return {
        teacher.model_path: said
        for name, teacher in loaded.teacher_specs().items()
        if teacher.model_path is not None
        and (said := written[name].model_path) is not None
        and said != teacher.model_path
    }


async def weights_admitted(
    session: AsyncSession, team_id: int, spec: JobSpec, settings: Settings
) -> JobSpec:
    """The admission rule: `spec` as given once `checked_weights` passed. The stored spec
    keeps the paths the team wrote; the worker and the playground resolve them again."""
    await checked_weights(session, team_id, spec, settings)
    return spec


def local_base_model(param: str, model: str, settings: Settings) -> None:
    """A base_model the local backend reads as a folder or a GGUF file: absolute, under the
    data root."""
    if not is_model_path(model):
        return
    if not model.startswith("/"):  # relative to the worker's directory, unknowable
        raise SpecRefused(param, BASE_MODEL_RULE)
    local_folder(param, model, settings, BASE_MODEL_RULE)
