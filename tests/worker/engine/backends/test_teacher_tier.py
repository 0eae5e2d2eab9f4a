"""A teacher tier (OPD_TEACHER_REPLICAS): several real HTTP servers of one model behind the
URL a spec writes. Requests go to the least busy replica; one that fails (down, 5xx) rests
while the others take its requests, and the warning says so without naming its URL; the
tally says how long the job waited and each replica's share."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from pytrio.types import ModelInput

from kernel.spec import TeacherServer
from opd.serve import free_port
from tests.fakes.vllm_server import ByteTokenizer, FakeVLLM, serving
from tests.support import assert_close
from tests.worker.engine.backends.test_server_teacher import PROMPTS, expected
from worker.engine.backends.server import REPLICAS, REST_SECONDS, ServerTeacher
from worker.engine.loop.metrics import teacher_tier_metrics
from worker.engine.teachers.views import TeacherView

SPEC_URL = "http://teachers.example/v1"


@pytest.fixture(autouse=True)
def fresh_replicas() -> Iterator[None]:
    """Replicas are the process's (every job's): each test starts with none known."""
    REPLICAS.clear()
    yield
    REPLICAS.clear()


@pytest.fixture
def fakes() -> list[FakeVLLM]:
    return [FakeVLLM() for _ in range(3)]


@pytest.fixture
def urls(fakes: list[FakeVLLM]) -> Iterator[list[str]]:
    with ExitStack() as stack:
        yield [stack.enter_context(serving(fake)) for fake in fakes]


def tier(replicas: list[str], warnings: list[tuple[str, dict]], **options: object) -> ServerTeacher:
    settings = {"url": SPEC_URL, "model": "job-7", "retry_delay_seconds": 0.01} | options
    return ServerTeacher(
        TeacherServer.model_validate(settings),
        ByteTokenizer(),
        warn=lambda message, data: warnings.append((message, data)),
        replicas=replicas,
    )


async def scored(client: ServerTeacher, prompts: list[list[int]]) -> list[list[float | None]]:
    return await asyncio.gather(
        *(client.compute_logprobs_async(ModelInput.from_ints(p)) for p in prompts)
    )


async def test_requests_spread_over_the_least_busy_replicas(fakes, urls):
    client = tier(urls, [], batch_size=1, max_concurrency=6)
    try:
        scores = await scored(client, PROMPTS)  # six at once
        for prompt, values in zip(PROMPTS, scores, strict=True):
            assert_close(values[1:], expected(prompt)[1:], what="the logprobs")
        assert [len(fake.bodies) for fake in fakes] == [2, 2, 2]
        assert all(fake.most_in_flight == 2 for fake in fakes)
        for prompt in PROMPTS[:3]:  # one at a time: round the replicas in turn
            await scored(client, [prompt])
        assert [len(fake.bodies) for fake in fakes] == [3, 3, 3]

        metrics = teacher_tier_metrics([TeacherView("math", client)])
        shares = [metrics[f"teacher/replica_share/math/{n}"] for n in (1, 2, 3)]
        assert shares == pytest.approx([1 / 3] * 3)
        assert metrics["time/teacher_wait"] >= 4 * 0.02  # four rounds of requests, each >= 20 ms
        again = teacher_tier_metrics([TeacherView("math", client)])
        assert again["time/teacher_wait"] == 0 and again["teacher/replica_share/math/1"] == 0
    finally:
        await client.aclose()


async def test_the_jobs_of_a_worker_share_the_replicas_least_busy_first(fakes, urls):
    """Two jobs, one request at a time each, in turn: the requests go round the three
    replicas as one job's would, and each job's tally counts its own requests."""
    jobs = [tier(urls, [], batch_size=1), tier(urls, [], batch_size=1)]
    try:
        for turn, prompt in enumerate(PROMPTS):
            await scored(jobs[turn % 2], [prompt])
        assert [len(fake.bodies) for fake in fakes] == [2, 2, 2]
        assert sum(jobs[0].tally().shares) == pytest.approx(1)
    finally:
        for job in jobs:
            await job.aclose()


async def test_a_failing_replica_rests_while_the_others_answer(fakes, urls):
    down = f"http://127.0.0.1:{free_port()}/v1"
    fakes[1].script = [503]
    warnings: list[tuple[str, dict]] = []
    client = tier([down, urls[1], urls[2]], warnings, batch_size=1, max_retries=0)
    try:
        scores = await scored(client, PROMPTS)
        for prompt, values in zip(PROMPTS, scores, strict=True):
            assert_close(values[1:], expected(prompt)[1:], what="the logprobs")
        # With no retries allowed, each request still reached a replica that answered.
        assert len(fakes[1].bodies) + len(fakes[2].bodies) == len(PROMPTS) + 1
        rested = sorted(data["replica"] for _, data in warnings)
        assert rested == [1, 2], warnings
        message, data = warnings[0]
        assert "of 3 of teacher server " + SPEC_URL in message and "rests 30 s" in message
        assert down not in message and urls[1] not in message  # the operator's machines
        assert data["server"] == SPEC_URL and data["rest_seconds"] == REST_SECONDS
        # Resting: no request goes to the failed ones while another is awake.
        before = len(fakes[1].bodies)
        await scored(client, PROMPTS[:2])
        assert len(fakes[1].bodies) == before
    finally:
        await client.aclose()


async def test_every_replica_failing_is_the_servers_failure(urls):
    downs = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    warnings: list[tuple[str, dict]] = []
    client = tier(downs, warnings, max_retries=0)
    try:
        with pytest.raises(Exception) as failed:
            await scored(client, PROMPTS[:1])
        assert getattr(failed.value, "code", None) == "teacher_server_unavailable"
        assert SPEC_URL in str(failed.value) and not any(d in str(failed.value) for d in downs)
        assert [data["replica"] for _, data in warnings] == [1]  # the last had no other
    finally:
        await client.aclose()
