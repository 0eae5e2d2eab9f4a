"""A thin HTTP client of the OPD API, for the `opd` commands and scripts.

The address comes from `--url` / `OPD_URL`; the key from `--key` / `OPD_API_KEY`, or the
local key `opd serve` wrote under `OPD_HOME`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from kernel.spec import JobSpec

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = {"succeeded", "failed", "cancelled"}
REVERSE_KL = "opd/reverse_kl_mean"


class ApiError(Exception):
    """The API answered with an error (message from its `{"error": ...}` body)."""


def local_key_path(home: Path) -> Path:
    return home / "api-key"


def default_key() -> str | None:
    if key := os.environ.get("OPD_API_KEY"):
        return key
    from app.core.config import get_settings

    path = local_key_path(get_settings().home)
    return path.read_text().strip() if path.is_file() else None


class OPDClient:
    def __init__(self, url: str | None = None, key: str | None = None, timeout: float = 30):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(
            base_url=url or os.environ.get("OPD_URL", DEFAULT_URL),
            headers=headers,
            timeout=timeout,
        )

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ApiError(f"cannot reach the OPD API at {self.http.base_url}: {error}") from error
        if response.is_success:
            return response.json()
        try:
            detail = response.json()["error"]
            message = detail["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise ApiError(f"HTTP {response.status_code}: {message}")

    def submit(self, spec: JobSpec, idempotency_key: str | None = None) -> dict[str, Any]:
        """POST the spec as written (its unset fields left to the service's defaults), so
        that a retry with the same key is the same request after either side upgrades."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = spec.model_dump(mode="json", exclude_unset=True)
        return self.request("POST", "/v1/jobs", json=body, headers=headers)

    def jobs(self, status: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit} | ({"status": status} if status else {})
        return self.request("GET", "/v1/jobs", params=params)["data"]

    def job(self, job_id: int) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}")

    def act(self, job_id: int, action: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/jobs/{job_id}/{action}")

    def usage(self, first: str, group_by: str, team: str | None = None) -> dict[str, Any]:
        params = {"from": first, "group_by": group_by} | ({"team": team} if team else {})
        return self.request("GET", "/v1/usage", params=params)

    def audit(self, limit: int = 50, action: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit} | ({"action": action} if action else {})
        return self.request("GET", "/v1/audit", params=params)["data"]

    def curve(self, job_id: int, key: str, from_step: int = 0) -> list[tuple[int, float | None]]:
        params = {"keys": key, "from_step": from_step, "max_points": 10_000}
        curves = self.request("GET", f"/v1/jobs/{job_id}/metrics", params=params)["curves"]
        curve = curves.get(key) or {"steps": [], "values": []}
        return list(zip(curve["steps"], curve["values"], strict=True))

    def samples(
        self, job_id: int, step: int | None = None, limit: int = 20
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit} | ({"step": step} if step is not None else {})
        return self.request("GET", f"/v1/jobs/{job_id}/samples", params=params)["data"]

    def checkpoints(self, job_id: int) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/jobs/{job_id}/checkpoints")["data"]

    def watch(self, job_id: int, interval: float = 1.0) -> dict[str, Any]:
        """A live progress bar with the reverse KL until the job ends; returns the job."""
        job = self.job(job_id)
        seen = 0
        with tqdm(
            total=job["total_steps"],
            desc=f"job {job_id} {job['name']}",
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
        ) as bar:
            while True:
                for step, value in self.curve(job_id, REVERSE_KL, seen):
                    if value is not None:
                        bar.set_postfix(reverse_kl=f"{value:.4f}")
                    seen = step + 1
                bar.set_description(f"job {job_id} {job['status']}")
                bar.update(min(job["total_steps"], job["steps_done"]) - bar.n)
                if job["status"] in TERMINAL:
                    return job
                time.sleep(interval)
                job = self.job(job_id)
