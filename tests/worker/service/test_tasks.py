"""The arq task in process, on a real SQLite database and Redis, against the PyTRIO fake:
what the worker does when a training call's result is lost after it was sent, when a
pipelined job is cancelled, and how an attempt's heartbeat stops."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import time
import uuid
from concurrent.futures import Future
from typing import Any

import pytest
from pytrio.errors.actor import ActorAPIError
from pytrio.types import APIFuture
from sqlalchemy import make_url, select, update

from app.auth.job_tokens import JOB_TOKEN_SECONDS, JobClaims, JobTokens
from app.auth.keys import create_key
from app.core.config import Settings
from app.core.db import create_db_engine, migrate, session_factory
from app.core.queue import JobQueue
from app.curves.tables import StepMetric
from app.jobs.continuation import fill_init_from
from app.jobs.limits import Limits
from app.jobs.rows import get_job
from app.jobs.schemas import JobAction
from app.jobs.store import apply_action, claim_next, create_job, heartbeat
from app.jobs.tables import Checkpoint, Event, Job
from kernel.spec import JobSpec
from kernel.storage.blobs import StorageUnavailable
from kernel.storage.checkpoints import CheckpointStore
from tests.fakes.sinks import RecordingSink
from tests.fakes.trio import FakeServiceClient, FakeTrainingClient, patch_pytrio
from tests.support import REDIS_URL, temporary_bucket
from worker.engine.backends.local.presets import tiny_model, tiny_tokenizer
from worker.engine.data.prompts import Prompts
from worker.engine.loop.steps import run_loop
from worker.service.tasks import (
    Heartbeat,
    JobControl,
    WorkerContext,
    run_job,
    teacher_replicas,
    teacher_server_keys,
)

SPEC = {
    "backend": "trio",
    "student": {"base_model": "student/model", "lora_rank": 8},
    "teacher": {"base_model": "teacher/model"},
    "dataset": {"source": "inline", "prompts": ["What is 1 + 1?", "Name a prime."]},
    "sampling": {"max_tokens": 6},
    "loop": {"steps": 5, "batch_size": 2, "group_size": 2, "save_every": 2},
    "trio": {"call_attempts": 1},
}


@pytest.fixture
async def context(tmp_path):
    settings = Settings(home=tmp_path, redis_url=REDIS_URL, max_attempts=3)
    migrate(settings.database_url)
    engine = create_db_engine(settings.database_url)
    queue = JobQueue(REDIS_URL, f"opd-test-{uuid.uuid4().hex[:8]}")
    yield WorkerContext(settings, session_factory(engine), queue, "worker-1")
    await queue.close()
    await engine.dispose()


def lose_results(monkeypatch: pytest.MonkeyPatch, at_calls: set[int]) -> list[int]:
    """forward_backward takes effect, but the result of the listed calls (1-based) is lost."""
    sent = FakeTrainingClient.forward_backward_async
    calls: list[int] = []

    async def sometimes_lost(self: FakeTrainingClient, *args: Any, **kwargs: Any) -> APIFuture:
        future = await sent(self, *args, **kwargs)
        calls.append(len(calls) + 1)
        if len(calls) not in at_calls:
            return future
        lost: Future[Any] = Future()
        lost.set_exception(ActorAPIError("Event poll failed", status_code=503))
        return APIFuture(lost)

    monkeypatch.setattr(FakeTrainingClient, "forward_backward_async", sometimes_lost)
    return calls


async def submit(context: WorkerContext, spec: dict[str, Any] = SPEC, team: str = "team") -> int:
    """Store a job as the API would (its init_from paths filled), past the API's checks."""
    async with context.sessions() as session:
        team_id = (await create_key(session, team)).team.id
        filled = await fill_init_from(session, team_id, JobSpec.model_validate(spec))
        return (await create_job(session, team_id, filled)).job.id


async def test_a_lost_training_result_resumes_the_job_from_its_last_state(monkeypatch, context):
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    lose_results(monkeypatch, {4})
    job_id = await submit(context)

    # The slot requeues the job, then (the fairest job to start) takes it again at once.
    outcome = await run_job({"opd": context}, job_id)

    assert outcome == f"job {job_id}: queued; job {job_id}: succeeded"
    async with context.sessions() as session:
        done = await get_job(session, job_id)
        events = (
            await session.execute(select(Event.message).where(Event.job_id == job_id))
        ).scalars()
        requeue = next(message for message in events if message.startswith("Requeued"))
        steps = (
            await session.execute(select(StepMetric.step).where(StepMetric.job_id == job_id))
        ).scalars()
        assert sorted(steps) == [0, 1, 2, 3, 4]
        first_state = (
            (
                await session.execute(
                    select(Checkpoint.path).where(
                        Checkpoint.job_id == job_id,
                        Checkpoint.kind == "state",
                        Checkpoint.step == 2,
                    )
                )
            )
            .scalars()
            .first()
        )
    assert "may have taken effect" in requeue and "Resuming from the last saved state" in requeue
    assert (done.attempts, done.error_code) == (2, None)
    loads = fake.calls_named("load_state_with_optimizer")
    assert [call.args["path"] for call in loads] == [first_state]


async def test_lost_results_fail_the_job_once_its_attempts_run_out(monkeypatch, context):
    patch_pytrio(monkeypatch, FakeServiceClient())
    lose_results(monkeypatch, set(range(1, 100)))
    job_id = await submit(context)

    outcome = await run_job({"opd": context}, job_id)

    assert outcome == f"job {job_id}: queued; job {job_id}: queued; job {job_id}: failed"
    async with context.sessions() as session:
        failed = await get_job(session, job_id)
    assert (failed.attempts, failed.error_code) == (3, "backend_unavailable")


async def test_an_off_policy_job_resumes_with_the_sampler_weights_it_recorded(monkeypatch, context):
    """With max_steps_off_policy: 1 the state saved after step 2 needs the weights of step 1,
    which the run recorded as sampler weights; the resumed job reads them from the database
    and repeats the uninterrupted steps."""
    spec = SPEC | {"loop": SPEC["loop"] | {"max_steps_off_policy": 1}}
    uninterrupted = RecordingSink()
    questions = SPEC["dataset"]["prompts"]
    await run_loop(
        JobSpec.model_validate(spec),
        FakeServiceClient(),
        Prompts(questions, [None] * len(questions)),
        uninterrupted,
    )
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    lose_results(monkeypatch, {4})
    job_id = await submit(context, spec)

    outcome = await run_job({"opd": context}, job_id)

    assert outcome == f"job {job_id}: queued; job {job_id}: succeeded"
    async with context.sessions() as session:
        rows = (
            await session.execute(
                select(StepMetric.step, StepMetric.metrics).where(StepMetric.job_id == job_id)
            )
        ).all()
        kept = (
            await session.execute(
                select(Checkpoint.path).where(
                    Checkpoint.job_id == job_id, Checkpoint.kind == "sampler", Checkpoint.step == 1
                )
            )
        ).scalar_one()
    assert sorted(step for step, _ in rows) == [0, 1, 2, 3, 4]
    for step, metrics in rows:
        for key in ("opd/reverse_kl_mean", "trainer/loss_sum", "train/staleness_max"):
            assert metrics[key] == uninterrupted.steps[step][key], (step, key)
    loaded = [call.args["model_path"] for call in fake.calls_named("create_sampling_client")]
    assert kept in loaded


def distilling(**weights: Any) -> dict[str, Any]:
    """SPEC with, as its teacher, sampler weights trained on the student's base model."""
    return SPEC | {"teacher": {"base_model": "student/model", **weights}}


async def test_a_teacher_the_team_trained_is_loaded_through_its_init_from(monkeypatch, context):
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    trained = await submit(context)
    assert await run_job({"opd": context}, trained) == f"job {trained}: succeeded"
    job_id = await submit(context, distilling(init_from={"job": trained}))

    assert await run_job({"opd": context}, job_id) == f"job {job_id}: succeeded"
    async with context.sessions() as session:
        final = (await get_job(session, trained)).final_weights_path
    teachers = [
        call.args["model_path"]
        for call in fake.calls_named("create_sampling_client")
        if call.args["base_model"] == "student/model" and call.args["model_path"] is not None
    ]
    assert final is not None and teachers == [final]


async def trained_weights(context: WorkerContext) -> tuple[int, str]:
    """A job of team "team" run to its end, and the final weights it saved."""
    trained = await submit(context)
    await run_job({"opd": context}, trained)
    async with context.sessions() as session:
        final = (await get_job(session, trained)).final_weights_path
    assert final is not None
    return trained, final


async def test_the_worker_refuses_another_teams_weights_before_loading_anything(
    monkeypatch, context
):
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    _, final = await trained_weights(context)
    # Stored past the API's check (as a job submitted before the check existed would be).
    job_id = await submit(context, distilling(model_path=final), team="another")
    calls = len(fake.calls)

    assert await run_job({"opd": context}, job_id) == f"job {job_id}: failed"
    async with context.sessions() as session:
        failed = await get_job(session, job_id)
    assert failed.error_code == "bad_model_path"
    assert "teacher.model_path" in failed.error_message and final not in failed.error_message
    assert fake.calls[calls:] == [], "nothing was loaded"


@pytest.mark.parametrize(("asked_in_step", "steps_done"), [(2, 3), (4, 5)])
async def test_a_cancelled_off_policy_job_stops_at_the_next_boundary_without_sampler_weights(
    monkeypatch, context, asked_in_step, steps_done
):
    """k = 1: a cancel asked while step 2 trains ends the job at boundary 3, one asked
    while the last step trains ends it at the last boundary: `cancelled` either way, with
    its state saved there and no sampler or final weights."""
    spec = SPEC | {"loop": SPEC["loop"] | {"max_steps_off_policy": 1, "save_every": 0}}
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    job_id = await submit(context, spec)
    sent = FakeTrainingClient.forward_backward_async

    async def cancel_while_training(self: FakeTrainingClient, *args: Any, **kwargs: Any):
        if len(fake.calls_named("forward_backward")) == asked_in_step:
            async with context.sessions() as session:
                await apply_action(session, job_id, JobAction.cancel)
            context.running[job_id].ask(JobAction.cancel)  # as its next heartbeat would
        return await sent(self, *args, **kwargs)

    monkeypatch.setattr(FakeTrainingClient, "forward_backward_async", cancel_while_training)

    outcome = await run_job({"opd": context}, job_id)

    assert outcome == f"job {job_id}: cancelled"
    async with context.sessions() as session:
        job = await get_job(session, job_id)
        saved = (
            await session.execute(select(Checkpoint.kind).where(Checkpoint.job_id == job_id))
        ).all()
    assert (job.status, job.steps_done, job.last_state_step) == (
        "cancelled",
        steps_done,
        steps_done,
    )
    assert saved == [("state",)] and not fake.calls_named("save_weights")


async def store_past_the_api(context: WorkerContext, spec: dict[str, Any], team: str) -> int:
    """Store a job as no road in would now (a path given where the service fills one), as
    one stored before the rule existed would be."""
    async with context.sessions() as session:
        team_id = (await create_key(session, team)).team.id
        return (await create_job(session, team_id, JobSpec.model_validate(spec))).job.id


async def failure(context: WorkerContext, job_id: int) -> tuple[str | None, str | None, str]:
    """The failed job's code and message, and the message of its last event."""
    async with context.sessions() as session:
        failed = await get_job(session, job_id)
        query = select(Event.message).where(Event.job_id == job_id).order_by(Event.id.desc())
        last = (await session.execute(query)).scalars().first()
    assert failed.status == "failed" and last is not None
    return failed.error_code, failed.error_message, last


async def test_the_worker_loads_an_init_from_path_only_if_recorded_for_the_jobs_team(
    monkeypatch, context
):
    """Another team's saved weights, a system folder and a missing one, each given as a
    teacher's init_from.path: each job fails with the same words, having loaded nothing."""
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    trained, theirs = await trained_weights(context)
    answers = set()
    for n, path in enumerate((theirs, "/etc", "/nonexistent-xyz")):
        spec = distilling(init_from={"job": trained, "path": path})
        job_id = await store_past_the_api(context, spec, team=f"other-{n}")
        calls = len(fake.calls)

        assert await run_job({"opd": context}, job_id) == f"job {job_id}: failed"
        code, message, event = await failure(context, job_id)
        assert code == "bad_model_path" and message is not None
        assert message.startswith("teacher.init_from.path: not weights a job of this team saved")
        assert path not in message and path not in event
        assert fake.calls[calls:] == [], "nothing was loaded"
        answers.add((message, event))
    assert len(answers) == 1

    own = await store_past_the_api(
        context, distilling(init_from={"job": trained, "path": theirs}), "team"
    )
    assert await run_job({"opd": context}, own) == f"job {own}: succeeded"


async def test_the_worker_treats_a_relative_base_model_folder_as_a_path(context):
    """A base_model that climbs out of the worker's directory is a folder the worker will
    not open, worded the same whether what it names exists or not."""
    answers = set()
    for folder in ("etc", "nonexistent-xyz"):
        spec = SPEC | {"backend": "local", "student": {"base_model": "x/" + "../" * 12 + folder}}
        job_id = await store_past_the_api(context, spec, team=f"team-{folder}")
        assert await run_job({"opd": context}, job_id) == f"job {job_id}: failed"
        code, message, event = await failure(context, job_id)
        assert code == "bad_model_path" and message is not None
        assert message.startswith(
            "student.base_model: a model folder or GGUF file must be an absolute"
        )
        answers.add((message, event))
    assert len(answers) == 1


async def test_a_relative_teacher_model_path_is_reported_as_the_team_wrote_it(context):
    """`model_path: nothing-here` is read under the data root; the failure, its event and
    what trackers get say `nothing-here`, never the data root's folder."""
    spec = {
        "backend": "local",
        "student": {"base_model": "tiny-student"},
        "teacher": {"base_model": "tiny-student", "model_path": "nothing-here"},
        "dataset": {"source": "inline", "prompts": ["What is 1 + 1?"]},
        "sampling": {"max_tokens": 2},
        "loop": {"steps": 1, "batch_size": 1, "group_size": 2},
    }
    context.settings.data_root.mkdir(parents=True, exist_ok=True)
    job_id = await submit(context, spec)
    assert await run_job({"opd": context}, job_id) == f"job {job_id}: failed"
    _, message, event = await failure(context, job_id)
    assert message is not None and "'nothing-here'" in message, message
    for said in (message, event):
        assert str(context.settings.home) not in said, said


async def test_the_worker_reads_a_hub_id_from_the_hub_cache_only(context, tmp_path, monkeypatch):
    """A base_model shaped like a hub id is never a folder of the worker's directory: with
    a loadable model in `tests` and `org/model` there, each fails word for word as a hub id
    the cache lacks does, having loaded nothing from there."""
    monkeypatch.chdir(tmp_path)
    for folder in ("tests", "org/model"):
        tiny_model("tiny-student").save_pretrained(tmp_path / folder)
        tiny_tokenizer().save_pretrained(tmp_path / folder)
    answers = set()
    for n, model in enumerate(("tests", "no-such-xyz", "org/model", "org/no-such-xyz")):
        models = {"student": {"base_model": model}, "teacher": {"base_model": "tiny-teacher"}}
        job_id = await submit(context, SPEC | {"backend": "local", **models}, team=f"team-{n}")
        assert await run_job({"opd": context}, job_id) == f"job {job_id}: failed"
        code, message, event = await failure(context, job_id)
        assert code == "model_not_found" and message is not None
        answers.add((message.replace(model, "NAME"), event.replace(model, "NAME")))
    assert len(answers) == 1, answers


async def test_a_stopped_heartbeat_lets_its_update_finish_and_ends(context):
    """The heartbeat is stopped while its UPDATE waits for SQLite's write lock: it ends once
    the UPDATE has committed. Cancelling it there instead invalidated the connection
    mid-transaction, and the error its cleanup raised swallowed the cancel: the beat went
    on, its attempt waited for it forever, and the job stayed running (the e2e modules on
    SQLite hung so under load)."""
    ctx = dataclasses.replace(
        context, settings=context.settings.model_copy(update={"heartbeat_interval": 0.05})
    )
    job_id = await submit(ctx)
    async with ctx.sessions() as session:
        limits = Limits.of(ctx.settings)
        claimed = await claim_next(session, ctx.worker_id, heartbeat_timeout=60, limits=limits)
    assert claimed is not None and claimed.id == job_id
    holder = sqlite3.connect(str(make_url(ctx.settings.database_url).database))
    holder.execute("BEGIN IMMEDIATE")  # the write lock: the next heartbeat's UPDATE waits
    heart = Heartbeat(ctx, job_id, JobControl())
    await asyncio.sleep(0.5)
    stopping = asyncio.create_task(heart.stop())
    await asyncio.sleep(0.3)
    assert not stopping.done(), "stop waits for the UPDATE in flight"
    holder.rollback()
    holder.close()
    await asyncio.wait_for(stopping, 10)
    async with ctx.sessions() as session:  # nothing holds the write lock any more
        assert await heartbeat(session, job_id, ctx.worker_id) is None


async def test_the_worker_refuses_a_teacher_server_no_longer_listed(monkeypatch, context):
    """Stored past the API's check (the operator's list has since lost it): the job fails
    before anything is loaded or called."""
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    server = {"url": "http://vllm.internal:8000/v1", "model": "m"}
    job_id = await submit(context, SPEC | {"teacher": {"server": server}})

    assert await run_job({"opd": context}, job_id) == f"job {job_id}: failed"
    code, message, _ = await failure(context, job_id)
    assert code == "teacher_server_not_allowed" and message is not None
    assert message.startswith("teacher.server.url: http://vllm.internal:8000/v1 is not one")
    assert "OPD_TEACHER_SERVERS" in message and fake.calls == []


async def test_a_stored_spec_naming_a_key_variable_loads_and_fails_by_todays_rules(
    monkeypatch, context
):
    """A job stored before `teacher.server.api_key_env` was withdrawn: the worker reads its
    spec with the field absent (its stored JSON keeps it) and the job fails with our code
    and words, here for a server the operator does not list, never a crash at load."""
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    server = {"url": "http://vllm.internal:8000/v1", "model": "m"}
    job_id = await submit(context, SPEC | {"teacher": {"server": server}})
    stored = SPEC | {"teacher": {"server": server | {"api_key_env": "AWS_SECRET_ACCESS_KEY"}}}
    async with context.sessions() as session:
        await session.execute(update(Job).where(Job.id == job_id).values(spec=stored))
        await session.commit()

    assert await run_job({"opd": context}, job_id) == f"job {job_id}: failed"
    code, message, _ = await failure(context, job_id)
    assert code == "teacher_server_not_allowed" and message is not None, (code, message)
    assert "AWS_SECRET_ACCESS_KEY" not in message and fake.calls == []
    async with context.sessions() as session:
        assert (await get_job(session, job_id)).spec["teacher"]["server"]["api_key_env"]


def test_the_worker_sends_only_the_key_the_operator_bound_to_the_server(monkeypatch):
    """OPD_TEACHER_SERVERS binds each server to the worker's variable holding its key: that
    key goes to that server, and no other variable of the worker's ever does."""
    monkeypatch.setenv("VLLM_KEY", "sk-bound")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "bucket-secret")
    bound, bare = "http://vllm.internal:8000/v1", "http://sglang.internal:30000/v1"
    settings = Settings(teacher_servers={bound + "/": "VLLM_KEY", bare: None})
    teachers = {
        "a": {"server": {"url": bound, "model": "m"}},
        "b": {"server": {"url": bare, "model": "m"}},
    }
    spec = JobSpec.model_validate(
        SPEC | {"teacher": None, "teachers": teachers, "teacher_mixture": "mixture"}
    )
    job = Job(id=7, team_id=3, spec={})
    assert teacher_server_keys(spec, settings, job) == {bound: "sk-bound"}
    monkeypatch.delenv("VLLM_KEY")
    assert teacher_server_keys(spec, settings, job) == {}


def test_a_teacher_servers_replicas_reach_the_worker_by_the_url_the_spec_writes(monkeypatch):
    """OPD_TEACHER_REPLICAS: the servers behind a listed URL, read from the environment; a
    replica of a server the operator did not list is refused when the settings load."""
    tier, alone = "http://teachers.internal/v1", "http://sglang.internal:30000/v1"
    replicas = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    monkeypatch.setenv("OPD_TEACHER_SERVERS", json.dumps({tier + "/": None, alone: None}))
    monkeypatch.setenv("OPD_TEACHER_REPLICAS", json.dumps({tier: replicas}))
    settings = Settings()
    teachers = {
        "a": {"server": {"url": tier, "model": "m"}},
        "b": {"server": {"url": alone, "model": "m"}},
    }
    spec = JobSpec.model_validate(
        SPEC | {"teacher": None, "teachers": teachers, "teacher_mixture": "mixture"}
    )
    assert teacher_replicas(spec, settings) == {tier: replicas}
    monkeypatch.setenv("OPD_TEACHER_REPLICAS", json.dumps({"http://elsewhere/v1": replicas}))
    with pytest.raises(ValueError, match="http://elsewhere/v1 is not in OPD_TEACHER_SERVERS"):
        Settings()


def test_the_services_own_v1_gets_fresh_tokens_of_the_job_never_a_key(monkeypatch, tmp_path):
    """A server bound to `self`: each request's token names the job and its team, is
    accepted by the API's keys (the same home) and lasts minutes; no variable is read."""
    monkeypatch.setenv("OPD_API_KEY", "opd_team_key")
    own = "http://127.0.0.1:8000/v1"
    settings = Settings(home=tmp_path, teacher_servers={own: "self"})
    spec = JobSpec.model_validate(SPEC | {"teacher": {"server": {"url": own, "model": "job-1"}}})
    keys = teacher_server_keys(spec, settings, Job(id=7, team_id=3, spec={}))
    mint = keys[own]
    assert callable(mint) and set(keys) == {own}
    first, later = mint(), mint()
    tokens = JobTokens.of(Settings(home=tmp_path))
    assert tokens.read(first, time.time()) == tokens.read(later, time.time()) == JobClaims(3, 7)
    assert tokens.read(first, time.time() + JOB_TOKEN_SECONDS + 1) is None
    assert "opd_team_key" not in first


LOCAL_SPEC = {
    "name": "stored",
    "backend": "local",
    "student": {"base_model": "tiny-student", "lora_rank": 8, "seed": 3},
    "teacher": {"base_model": "tiny-teacher"},
    "dataset": {"source": "inline", "prompts": ["What is 1 + 1?", "Name a prime."]},
    "sampling": {"max_tokens": 6},
    "loop": {"steps": 5, "batch_size": 2, "group_size": 2, "save_every": 2},
}


@pytest.fixture
async def bucket_context(context):
    with temporary_bucket() as url:
        settings = context.settings.model_copy(
            update={"storage_url": url, "storage_retry_seconds": 2}
        )
        yield dataclasses.replace(context, settings=settings)


def store_fails(monkeypatch: pytest.MonkeyPatch, at_calls: set[int]) -> None:
    """The listed uploads (1-based) find the store away, as after its retries."""
    upload = CheckpointStore.upload
    calls: list[int] = []

    async def sometimes_away(self: CheckpointStore, *args: Any) -> str:
        calls.append(len(calls) + 1)
        if len(calls) in at_calls:
            raise StorageUnavailable("the object store did not complete writing: refused")
        return await upload(self, *args)

    monkeypatch.setattr(CheckpointStore, "upload", sometimes_away)


async def test_a_store_outage_requeues_the_job_from_its_last_recorded_state(
    monkeypatch, bucket_context
):
    """The third upload (step 4's state) fails: nothing of it is recorded, the job resumes
    from step 2's state in the bucket and loses no step."""
    store_fails(monkeypatch, {3})
    job_id = await submit(bucket_context, LOCAL_SPEC)

    outcome = await run_job({"opd": bucket_context}, job_id)

    assert outcome == f"job {job_id}: queued; job {job_id}: succeeded"
    async with bucket_context.sessions() as session:
        done = await get_job(session, job_id)
        events = (await session.execute(select(Event).where(Event.job_id == job_id))).scalars()
        messages, resumed = [], []
        for event in events:
            messages.append(event.message)
            if event.message.startswith("Resumed from the state saved at step 2"):
                resumed.append(event.data["path"])
        steps = (
            await session.execute(select(StepMetric.step).where(StepMetric.job_id == job_id))
        ).scalars()
        paths = (
            await session.execute(
                select(Checkpoint.step, Checkpoint.kind, Checkpoint.path).where(
                    Checkpoint.job_id == job_id
                )
            )
        ).all()
    assert sorted(steps) == [0, 1, 2, 3, 4] and (done.attempts, done.error_code) == (2, None)
    requeue = next(message for message in messages if message.startswith("Requeued"))
    assert "object store did not complete" in requeue and "Resuming from" in requeue
    state_2 = next(path for step, kind, path in paths if (step, kind) == (2, "state"))
    assert resumed == [state_2]
    assert all(path.startswith("opd-store://") for _, _, path in paths)


async def test_a_store_that_stays_away_fails_the_job_once_its_attempts_run_out(
    monkeypatch, bucket_context
):
    store_fails(monkeypatch, set(range(1, 100)))
    job_id = await submit(bucket_context, LOCAL_SPEC)

    outcome = await run_job({"opd": bucket_context}, job_id)

    assert outcome == f"job {job_id}: queued; job {job_id}: queued; job {job_id}: failed"
    async with bucket_context.sessions() as session:
        failed = await get_job(session, job_id)
    assert (failed.attempts, failed.error_code) == (3, "storage_unavailable")
    assert "object store did not complete" in failed.error_message


async def test_a_vllm_server_away_past_its_retries_requeues_the_job_until_its_attempts_run_out(
    monkeypatch, context
):
    """`sampling.engine: vllm` with the server away (a port nothing listens on): each attempt
    retries with warnings, then goes back to the queue to resume from its last state; the
    job fails `vllm_unavailable` only once its attempts are spent."""
    from kernel.retry import Backoff
    from opd.serve import free_port
    from worker.engine.backends import vllm

    monkeypatch.setattr(vllm, "RETRY", Backoff(initial=0.05, cap=0.1, attempts=2))
    folder = context.settings.data_root / "student"
    tiny_model("tiny-student").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    servers = {str(folder): f"http://127.0.0.1:{free_port()}/v1"}
    context = dataclasses.replace(
        context, settings=context.settings.model_copy(update={"vllm_servers": servers})
    )
    spec = SPEC | {
        "backend": "local",
        "student": {"base_model": str(folder), "lora_rank": 4},
        "teacher": {"base_model": str(folder)},
        "sampling": {"max_tokens": 4, "engine": "vllm"},
    }
    job_id = await submit(context, spec)

    outcome = await run_job({"opd": context}, job_id)

    assert outcome == f"job {job_id}: queued; job {job_id}: queued; job {job_id}: failed"
    async with context.sessions() as session:
        failed = await get_job(session, job_id)
        events = (
            (await session.execute(select(Event.message).where(Event.job_id == job_id)))
            .scalars()
            .all()
        )
    assert (failed.attempts, failed.error_code) == (3, "vllm_unavailable")
    requeues = [e for e in events if "Resuming from the last saved state" in e]
    assert len(requeues) == 2 and all("did not answer" in e for e in requeues), events
    assert sum(e.startswith("Retrying the vLLM server") for e in events) == 3, events
