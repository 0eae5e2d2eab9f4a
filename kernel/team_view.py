"""What a team sees of where a job's weights lie: never a worker's folder.

Saved weights reach a team by name. A checkpoint in the object store is its
`opd-store://...` name and weights on a remote backend are its URI (`tinker://...`, the
team's own remote weights): neither is a folder of ours, so both are shown as they are. A
folder on a worker's disk is shown from its job's folder on (`job-2/weights/final`, the
artifact root left out), and any other local path as `[server folder]`: whatever lies
under the service's home (its data root, model cache, uploads) or elsewhere on its disks.
An absolute path anywhere in a text meant for a team (an error, an event) is one of these,
except the service's own routes (`/v1/jobs/2/clone`). Admin keys see the paths as
recorded, as the operator's logs do.

Where the service knows what the team wrote for a path it resolved (a relative
`teacher.model_path` is read under the data root), it says the team's words instead
(`in_team_words`), before the rule's catch-all could hide them.

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
PATH_IN_TEXT = re.compile(r"(?<![\w.:/~-])~?/[^\s'\"`/][^\s'\"`]*?(?=[.,;:!?)\]]*(?:[\s'\"`]|$))")
"""An absolute (or `~`) path in prose, without the punctuation that ends its sentence."""
ROUTE = re.compile(r"^/(?:v1|ui)(?:[/?#]|$)")
"""The service's own routes, which name no folder."""


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


def shown_path(path: str) -> str:
    """An absolute path as a team sees it: a route as it is, a folder named by the rule."""
    return path if ROUTE.match(path) else weights_name(path)


def masked_text(text: str) -> str:
    """`text` with every folder of the service's machines named by the rule."""
    return PATH_IN_TEXT.sub(lambda found: shown_path(found.group(0)), text)


def in_team_words(value: Any, words: dict[str, str]) -> Any:
    """A text (or an event's data) with each resolved path of `words` said as the team
    wrote it (longest first, so a folder inside another is replaced whole)."""
    if isinstance(value, str):
        for resolved in sorted(words, key=len, reverse=True):
            value = value.replace(resolved, words[resolved])
        return value
    if isinstance(value, dict):
        return {key: in_team_words(item, words) for key, item in value.items()}
    if isinstance(value, list):
        return [in_team_words(item, words) for item in value]
    return value


def masked_data(value: Any) -> Any:
    """An event's data with no folder of the service's machines in any of its strings."""
    if isinstance(value, str):
        return shown_path(value) if value.startswith(("/", "~")) else masked_text(value)
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
