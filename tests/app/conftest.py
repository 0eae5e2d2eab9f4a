"""Fixtures for the service side: a migrated database (SQLite and Postgres), real Redis,
teams with keys, and an HTTP client on the app.

Every test that takes `database_url` (directly or through another fixture) runs once on
SQLite and once on a fresh Postgres database that is created for the test session and
dropped after it. Redis tests use database 15 and a queue name unique to the test.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import httpx2
import openai
import pytest
from pydantic.fields import FieldInfo
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.keys import NewKey, create_key
from app.auth.schemas import Scope
from app.core.config import Settings
from app.core.db import create_db_engine, migrate, session_factory
from app.core.encryption import SecretBox, secret_box
from app.core.queue import JobQueue
from app.jobs.store import create_job
from app.jobs.tables import Event, Job
from app.main import create_app
from kernel.spec import JobSpec, LoopSpec
from tests.app.fuzzing import BASE, JOBS
from tests.support import REDIS_URL, named, temporary_postgres_database

CLOSED_REDIS_URL = "redis://127.0.0.1:1/0"

MakeKey = Callable[..., Awaitable[NewKey]]


def small_spec(**overrides: Any) -> dict[str, Any]:
    """A valid spec with an inline dataset; top-level groups can be replaced (a student or
    teacher group given keeps the reference's base_model unless it names one)."""
    spec: dict[str, Any] = {
        "name": "test-job",
        "backend": "local",
        "dataset": {"source": "inline", "prompts": ["What is 1 + 1?"]},
        "loop": {"steps": 3},
    }
    return named(spec | overrides)


def auth(key: NewKey) -> dict[str, str]:
    return {"Authorization": f"Bearer {key.key}"}


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A Postgres database for this test session."""
    with temporary_postgres_database() as url:
        yield url


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated database of each kind, shared by the session's tests."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'opd.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    migrate(url)
    return url


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_db_engine(database_url)
    yield session_factory(engine)
    await engine.dispose()


@pytest.fixture
async def session(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    async with sessions() as session:
        yield session


@pytest.fixture
def make_key(sessions: async_sessionmaker[AsyncSession]) -> MakeKey:
    """Create an API key for a new team (or the named one)."""

    async def make(
        team: str | None = None, *, admin: bool = False, scope: Scope | None = None
    ) -> NewKey:
        scope = scope or (Scope.admin if admin else Scope.submit)
        async with sessions() as session:
            return await create_key(session, team or f"team-{uuid.uuid4().hex[:8]}", scope=scope)

    return make


@pytest.fixture
async def key(make_key: MakeKey) -> NewKey:
    return await make_key()


@pytest.fixture
def queue_name() -> str:
    return f"opd-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis(queue_name: str) -> AsyncIterator[Redis]:
    """The test Redis; every key naming this test's queue is deleted afterwards."""
    client = Redis.from_url(REDIS_URL)
    yield client
    keys = [k async for k in client.scan_iter(match=f"*{queue_name}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
async def queue(queue_name: str, redis: Redis) -> AsyncIterator[JobQueue]:
    job_queue = JobQueue(REDIS_URL, queue_name)
    yield job_queue
    await job_queue.close()


@pytest.fixture
def settings(tmp_path: Any, database_url: str, queue_name: str, redis: Redis) -> Settings:
    return Settings(
        home=tmp_path,
        database_url=database_url,
        redis_url=REDIS_URL,
        queue_name=queue_name,
        migrate_on_start=False,
        auth_cache_seconds=0,
        job_cache_seconds=0,
        stream_poll_interval=0.05,
    )


@pytest.fixture
def box(settings: Settings) -> SecretBox:
    """The secret box of the installation `settings` describe (its key made in its home),
    the one its API and workers use."""
    return secret_box(settings)


@asynccontextmanager
async def serve(settings: Settings, *, raising: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on a freshly created app, run through its lifespan; `raising` False
    answers an unexpected error with the app's 500 instead of raising it in the test."""
    app = create_app(settings)
    transport = httpx.ASGITransport(app, raise_app_exceptions=raising)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://opd") as http,
    ):
        yield http


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(settings) as http:
        yield http


@pytest.fixture
def submit(client: httpx.AsyncClient, key: NewKey) -> Callable[..., Awaitable[dict[str, Any]]]:
    """POST a small job as `key`'s team (or another key's) and return its JSON."""

    async def post(as_key: NewKey | None = None, **overrides: Any) -> dict[str, Any]:
        response = await client.post(
            "/v1/jobs", json=small_spec(**overrides), headers=auth(as_key or key)
        )
        assert response.status_code == 201, response.text
        return response.json()

    return post


@pytest.fixture
async def job_ids(
    submit: Callable[..., Awaitable[dict[str, Any]]], make_key: MakeKey
) -> dict[str, int]:
    """A job of `key`'s team and one of another team, by the names fuzzed sweeps give
    their `base_job` (tests/app/fuzzing.py)."""
    own = await submit(**BASE)
    stranger = await submit(await make_key(), **BASE)
    return dict(zip(JOBS, (own["id"], stranger["id"]), strict=True))


@contextmanager
def upgraded_spec() -> Iterator[None]:
    """The spec of a later version of the service: `loop` gained a field with a default."""
    LoopSpec.model_fields["added_later"] = FieldInfo(annotation=int, default=7)
    try:
        for model in (LoopSpec, JobSpec):
            model.model_rebuild(force=True)
        yield
    finally:
        del LoopSpec.model_fields["added_later"]
        for model in (LoopSpec, JobSpec):
            model.model_rebuild(force=True)


@pytest.fixture
async def job(session, key) -> Job:
    return (await create_job(session, key.team.id, JobSpec.model_validate(small_spec()))).job


async def events_of(session, job_id: int) -> list[str]:
    query = select(Event.message).where(Event.job_id == job_id).order_by(Event.id)
    rows = await session.execute(query)
    return list(rows.scalars())


@pytest.fixture
async def openai_client(settings: Settings, key: NewKey) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official `openai` package's client on the app, as the key's team."""
    app = create_app(settings)
    transport = httpx2.ASGITransport(app)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(transport=transport, base_url="http://opd") as http,
    ):
        yield openai.AsyncOpenAI(
            base_url="http://opd/v1", api_key=key.key, http_client=http, max_retries=0
        )
