"""Where a run is mirrored besides the service: SwanLab and MLflow."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from kernel.spec.base import SpecModel


class SwanLabSpec(SpecModel):
    enabled: bool = Field(False, description="Log the run to SwanLab too.")
    project: str = Field(
        "trio-case", min_length=1, max_length=200, description="The SwanLab project."
    )
    workspace: str | None = Field(
        None, max_length=200, description="The SwanLab workspace; null = the login's own."
    )
    mode: Literal["online", "local", "offline", "disabled"] | None = Field(
        None,
        description="SwanLab's mode: offline writes a run folder (`swanlab sync` uploads "
        "it), online needs a login, local the `swanlab[dashboard]` extra; null = SwanLab's "
        "default.",
    )


class MlflowSpec(SpecModel):
    """The MLflow run a job is mirrored into (the worker needs the `mlflow` extra)."""

    tracking_uri: str = Field(
        min_length=1,
        max_length=2000,
        description="The tracking server, http(s)://host[:port][/path]; credentials come from "
        "the worker's MLFLOW_TRACKING_TOKEN (or _USERNAME/_PASSWORD), never from the spec.",
    )
    experiment: str = Field(
        "opd", min_length=1, max_length=500, description="The MLflow experiment (made if new)."
    )
    run_name: str | None = Field(None, min_length=1, max_length=250, description="null = name.")
    log_final_weights: bool = Field(
        False,
        description="Also upload the final weights (the LoRA adapter folder) as the run's "
        "`final_weights` artifact, when the worker holds them as a folder (backend: local).",
    )

    @field_validator("tracking_uri")
    @classmethod
    def _http_server(cls, uri: str) -> str:
        parts = urlsplit(uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("should be an http:// or https:// URL of a tracking server")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials (the worker's environment holds them)")
        return uri


class TrackersSpec(SpecModel):
    """Experiment trackers a job is mirrored into, beside the service's own records."""

    mlflow: MlflowSpec | None = Field(
        None,
        description="Params, every step's metrics, evals, checkpoint paths (as tags), the "
        "spec as the artifact `opd/spec.yaml` (and, if asked, the final weights) and the "
        "final status; null = none.",
    )
