"""`Client` (blocking) and `AsyncClient` (asyncio): the OPD API's resources as typed calls,
and the jobs they return (`Job`, `AsyncJob`), which know the client they came from.

The address comes from `url` / `OPD_URL`; the key from `key` / `OPD_API_KEY`, or the local
admin key `opd serve` wrote under `OPD_HOME`.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Generic, Self

import httpx
from pydantic import PrivateAttr

from app.jobs.schemas import JobPublic
from opd.sdk.resources.base import X
from opd.sdk.resources.files import Files
from opd.sdk.resources.jobs import J, Jobs
from opd.sdk.resources.stored import StoredCompletions
from opd.sdk.resources.sweeps import Sweeps
from opd.sdk.resources.teams import Audit, Keys, Teams, Usage
from opd.sdk.resources.webhooks import Webhooks
from opd.sdk.transport import AsyncTransport, Retries, SyncTransport

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 30.0


def local_key_path(home: Path) -> Path:
    return home / "api-key"


def default_key() -> str | None:
    if key := os.environ.get("OPD_API_KEY"):
        return key
    from app.core.config import get_settings  # start-up time: read only without a key

    path = local_key_path(get_settings().home)
    return path.read_text().strip() if path.is_file() else None


def http_options(url: str | None, key: str | None, timeout: float) -> dict[str, object]:
    key = key or default_key()
    return {
        "base_url": url or os.environ.get("OPD_URL", DEFAULT_URL),
        "headers": {"Authorization": f"Bearer {key}"} if key else {},
        "timeout": timeout,
    }


class BoundJob(JobPublic):
    """What `Job` and `AsyncJob` share: whether creating it found it made already."""

    _existed: bool = PrivateAttr(False)

    @property
    def existed(self) -> bool:
        """From `jobs.create`: True when an earlier request with the same Idempotency-Key
        had created the job (the API answered 200 with it, not 201)."""
        return self._existed


class Job(BoundJob):
    """A job as the API shows it (`JobPublic`), that knows the client it came from."""

    _client: Client = PrivateAttr()

    def refresh(self) -> Job:
        return self._client.jobs.get(self.id)

    def wait(
        self, *, progress: bool = False, interval: float = 1.0, timeout: float | None = None
    ) -> Job:
        """Poll until the job ends; `progress`: a bar with the reverse KL on stderr."""
        return self._client.jobs.wait(
            self.id, progress=progress, interval=interval, timeout=timeout
        )


class AsyncJob(BoundJob):
    """`Job` for the AsyncClient: `await job.wait()`."""

    _client: AsyncClient = PrivateAttr()

    async def refresh(self) -> AsyncJob:
        return await self._client.jobs.get(self.id)

    async def wait(
        self, *, progress: bool = False, interval: float = 1.0, timeout: float | None = None
    ) -> AsyncJob:
        return await self._client.jobs.wait(
            self.id, progress=progress, interval=interval, timeout=timeout
        )


class Resources(Generic[X, J]):
    """What a client has: the API's resources, over its transport."""

    def __init__(self, sender: X, job: type[J]) -> None:
        self.jobs: Jobs[X, J] = Jobs(self, sender, job)
        self.sweeps: Sweeps[X] = Sweeps(self, sender)
        self.files: Files[X] = Files(self, sender)
        self.usage: Usage[X] = Usage(self, sender)
        self.audit: Audit[X] = Audit(self, sender)
        self.keys: Keys[X] = Keys(self, sender)
        self.teams: Teams[X] = Teams(self, sender)
        self.webhooks: Webhooks[X] = Webhooks(self, sender)
        self.stored_completions: StoredCompletions[X] = StoredCompletions(self, sender)


class Client(Resources[SyncTransport, Job]):
    """The OPD API. `with Client() as opd: opd.jobs.create(spec).wait(progress=True)`.

    Transport errors, 5xx and 429 are retried (`retries`); every POST carries an
    `Idempotency-Key`, so a retried submission never makes two jobs."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: Retries | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.http = httpx.Client(**http_options(url, key, timeout), transport=transport)
        super().__init__(SyncTransport(self.http, retries or Retries()), Job)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient(Resources[AsyncTransport, AsyncJob]):
    """`Client` for asyncio: the same resources, each call awaited, lists `async for`."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: Retries | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.http = httpx.AsyncClient(**http_options(url, key, timeout), transport=transport)
        super().__init__(AsyncTransport(self.http, retries or Retries()), AsyncJob)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
