"""What a team sees of where a job's weights lie: never a worker's folder.

Saved weights reach a team by name. A checkpoint in the object store is its
`opd-store://...` name and weights on a remote backend are its URI (`tinker://...`, the
team's own remote weights): neither is a folder of ours, so both are shown as they are. A
folder on a worker's disk is shown from its job's folder on (`job-2/weights/final`, the
artifact root left out), and any other local path as `[server folder]`. Admin keys see
the paths as recorded, as the operator's logs do.

The rules are pure, so the API (app/jobs/visibility.py) and the worker's trackers (an
MLflow run or SwanLab project a spec names is the team's to read) show the same names.
"""

from __future__ import annotations

import re
from typing import Any, overload

HIDDEN = "[server folder]"
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
JOB_FOLDER = re.compile(r"(?:^|/)(job-\d+(?:/.*)?)$")
"""A path's part from its job's folder on (the leftmost `job-N` component)."""
FOLDER_IN_TEXT = re.compile(r"(?<![\w.:/~-])/(?:[^\s'\"]*?/)?(job-\d+(?=[/\s'\",;)]|$)[^\s'\"]*)")
"""An absolute path in prose that goes through a job's folder; an API route
(`/v1/jobs/2/clone`) names no `job-N` folder and is left alone."""


@overload
def weights_name(path: str) -> str: ...
@overload
def weights_name(path: None) -> None: ...
def weights_name(path: str | None) -> str | None:
    """What a team sees of a recorded weights location (see the module's rule)."""
    if path is None or URL.match(path):
        return path
    found = JOB_FOLDER.search(path)
    return found.group(1) if found else HIDDEN


def masked_text(text: str) -> str:
    """`text` with every worker folder of a job shown from the job's folder on."""
    return FOLDER_IN_TEXT.sub(lambda found: found.group(1), text)


def masked_data(value: Any) -> Any:
    """An event's data with no worker folder in any of its strings."""
    if isinstance(value, str):
        return weights_name(value) if value.startswith(("/", "~")) else masked_text(value)
    if isinstance(value, dict):
        return {key: masked_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [masked_data(item) for item in value]
    return value


def named_init_from(part: Any) -> Any:
    """A student or teacher (as a dict) with its `init_from`'s filled path named."""
    if not (isinstance(part, dict) and isinstance(part.get("init_from"), dict)):
        return part
    init = part["init_from"]
    return {**part, "init_from": {**init, "path": weights_name(init.get("path"))}}


def masked_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec (as stored, or dumped) with the paths the service filled into its
    `init_from`s named instead."""
    masked = {key: named_init_from(spec[key]) for key in ("student", "teacher") if key in spec}
    if isinstance(teachers := spec.get("teachers"), dict):
        masked["teachers"] = {name: named_init_from(one) for name, one in teachers.items()}
    return {**spec, **masked}
