"""Stored completions with the official `openai` package as the client, on the API with a
worker's quick tasks beside it and a job trained on the PyTRIO fake, on SQLite and
Postgres: `store: true` keeps what a chat or text completion served (its conversation,
settings, tokens and logprobs), which the list door pages and filters (model, metadata,
order) and the read, update, messages and delete doors answer in OpenAI's shapes; feedback
is listed with its completion; another team's id reads as missing on every door; a team
past its quota is refused before anything is sampled; a replayed request keeps nothing
more."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import openai
import pytest
from sqlalchemy import delete, func, select

from app.auth.tables import ApiKey, Team
from app.stored_completions.tables import Feedback, StoredCompletion
from opd.sdk import AsyncClient, NotFound
from tests.app.conftest import auth
from tests.app.web.conftest import post_form
from tests.worker.service.test_quick import (  # noqa: F401 (fixtures)
    SPEC,
    job_spec,
    pytrio_fake,
)

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 1?"}]


def openai_on(api: Any, key: Any) -> openai.AsyncOpenAI:
    """The `openai` package's client on the app `api` serves, as `key`'s team."""
    http = httpx2.AsyncClient(
        transport=httpx2.ASGITransport(api._transport.app), base_url="http://opd"
    )
    return openai.AsyncOpenAI(
        base_url="http://opd/v1", api_key=key.key, http_client=http, max_retries=0
    )


@pytest.fixture
async def client(api, key) -> AsyncIterator[openai.AsyncOpenAI]:
    made = openai_on(api, key)
    yield made
    await made.close()


async def chat(client: openai.AsyncOpenAI, model: str, **more: Any) -> Any:
    return await client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=4, store=True, **more
    )


async def test_a_stored_chat_completion_reads_back_as_it_was_served(client, trained, session):
    model = f"job-{trained['id']}"
    served = await chat(client, model, metadata={"tag": "support"}, n=2, temperature=0.5)
    unstored = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=4)

    kept = await client.chat.completions.retrieve(served.id)
    assert kept.id == served.id and kept.object == "chat.completion" and kept.model == model
    assert [c.message.content for c in kept.choices] == [c.message.content for c in served.choices]
    assert kept.usage == served.usage and kept.metadata == {"tag": "support"}
    assert kept.feedback == []
    row = (await session.execute(select(StoredCompletion))).scalar_one()
    assert row.request["messages"] == CHAT
    assert (row.request["n"], row.request["temperature"], row.request["max_tokens"]) == (2, 0.5, 4)
    assert len(row.tokens) == 2 and all(
        len(choice["token_ids"]) == len(choice["logprobs"]) > 0 for choice in row.tokens
    )
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.retrieve(unstored.id)

    messages = await client.chat.completions.messages.list(served.id)
    assert [(m.role, m.content) for m in messages.data] == [
        ("system", "Be brief."),
        ("user", "1 + 1?"),
    ]
    assert [m.id for m in messages.data] == [f"{served.id}-0", f"{served.id}-1"]
    last = await client.chat.completions.messages.list(served.id, order="desc", limit=1)
    assert last.has_more and [m.content for m in last.data] == ["1 + 1?"]

    updated = await client.chat.completions.update(served.id, metadata={"tag": "done", "x": "1"})
    assert updated.metadata == {"tag": "done", "x": "1"}
    assert (await client.chat.completions.retrieve(served.id)).metadata == {"tag": "done", "x": "1"}

    deleted = await client.chat.completions.delete(served.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (
        served.id,
        True,
        "chat.completion.deleted",
    )
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.retrieve(served.id)


async def test_the_list_pages_and_filters_by_model_and_metadata(client, api, key, trained):
    model = f"job-{trained['id']}"
    tagged = [await chat(client, model, metadata={"tag": "a", "n": str(i)}) for i in range(3)]
    other = await chat(client, f"job-{trained['id']}:teacher", metadata={"tag": "b"})
    text = await client.completions.create(
        model=model,
        prompt="2 + 2 =",
        max_tokens=3,
        extra_body={"store": True, "metadata": {"tag": "t"}},
    )

    everything = [c.id async for c in client.chat.completions.list(limit=2)]
    assert everything == [*(c.id for c in tagged), other.id, text.id]
    first = await client.chat.completions.list(limit=2, order="desc")
    assert first.has_more and [c.id for c in first.data] == [text.id, other.id]
    by_tag = await client.chat.completions.list(metadata={"tag": "a"})
    assert [c.id for c in by_tag.data] == [c.id for c in tagged]
    both = await client.chat.completions.list(metadata={"tag": "a", "n": "1"})
    assert [c.id for c in both.data] == [tagged[1].id]
    teacher = await client.chat.completions.list(model=f"job-{trained['id']}:teacher")
    assert [c.id for c in teacher.data] == [other.id]

    kept = await client.chat.completions.retrieve(text.id)
    assert kept.choices[0].message.content == text.choices[0].text
    (turn,) = (await client.chat.completions.messages.list(text.id)).data
    assert turn.role == "user" and "2 + 2 =" in turn.content

    refused = await api.get("/v1/chat/completions", params={"order": "sideways"}, headers=auth(key))
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "order"


async def test_feedback_is_listed_with_its_completion(client, api, key, trained):
    served = await chat(client, f"job-{trained['id']}")
    url = f"/v1/chat/completions/{served.id}/feedback"
    given = await api.post(
        url, json={"rating": -1, "correction": "Answer with the number only"}, headers=auth(key)
    )
    assert given.status_code == 200, given.text
    assert given.json()["id"].startswith("fb-") and given.json()["completion_id"] == served.id
    await api.post(url, json={"rating": 1, "author": "ana"}, headers=auth(key))

    kept = await client.chat.completions.retrieve(served.id)
    assert [(f["rating"], f["correction"], f["author"]) for f in kept.feedback] == [
        (-1, "Answer with the number only", None),
        (1, None, "ana"),
    ]
    for body, param in (({}, "body"), ({"rating": 2}, "rating"), ({"rating": 1, "x": 1}, "x")):
        refused = await api.post(url, json=body, headers=auth(key))
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == param


async def test_the_sdk_lists_by_feedback_rates_corrects_relabels_and_deletes(
    client, api, key, trained
):
    """The SDK's `stored_completions` (what `opd feedback` runs), and the list door's own
    filters `rating` and `has_feedback`, which the `openai` package sends as extra query."""
    model = f"job-{trained['id']}"
    first, second, third = [await chat(client, model, metadata={"tag": "t"}) for _ in range(3)]
    transport = httpx.ASGITransport(api._transport.app)
    async with AsyncClient("http://opd", key.key, transport=transport) as opd:
        stored = opd.stored_completions
        given = await stored.feedback(
            first.id, rating=-1, correction="Answer with the number only", author="ana"
        )
        assert (given.completion_id, given.rating, given.author) == (first.id, -1, "ana")
        await stored.feedback(second.id, rating=1)

        async def ids(**filters: Any) -> list[str]:
            return [c.id async for c in stored.list(page_size=1, **filters)]

        assert await ids() == [first.id, second.id, third.id]
        assert await ids(newest_first=True) == [third.id, second.id, first.id]
        assert await ids(rating=-1) == [first.id]
        assert await ids(has_feedback=True) == [first.id, second.id]
        assert await ids(has_feedback=False, metadata={"tag": "t"}) == [third.id]
        assert await ids(metadata={"tag": "other"}) == []
        assert await ids(model=f"{model}:teacher") == []
        by_openai = await client.chat.completions.list(extra_query={"rating": 1})
        assert [c.id for c in by_openai.data] == [second.id]

        read = await stored.get(first.id)
        assert read.answer() == first.choices[0].message.content
        assert [f.correction for f in read.feedback] == ["Answer with the number only"]
        assert [(m.role, m.content) async for m in stored.messages(first.id)] == [
            (m["role"], m["content"]) for m in CHAT
        ]
        assert (await stored.update(first.id, {"tag": "seen"})).metadata == {"tag": "seen"}
        await stored.delete(third.id)
        assert await ids() == [first.id, second.id]
        with pytest.raises(NotFound):
            await stored.feedback(third.id, rating=1)
    refused = await api.get("/v1/chat/completions", params={"rating": 2}, headers=auth(key))
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "rating"


async def test_another_teams_completion_reads_as_missing_on_every_door(
    client, api, key, make_key, trained
):
    served = await chat(client, f"job-{trained['id']}", metadata={"tag": "mine"})
    stranger = await make_key()
    theirs = openai_on(api, stranger)
    missing = "chatcmpl-" + "0" * 32
    for completion_id in (served.id, missing):
        for door in (
            theirs.chat.completions.retrieve(completion_id),
            theirs.chat.completions.update(completion_id, metadata={"tag": "x"}),
            theirs.chat.completions.delete(completion_id),
            theirs.chat.completions.messages.list(completion_id),
        ):
            with pytest.raises(openai.NotFoundError) as error:
                await door
            assert error.value.body["code"] == "not_found"
        answer = await api.post(
            f"/v1/chat/completions/{completion_id}/feedback",
            json={"rating": 1},
            headers=auth(stranger),
        )
        assert answer.status_code == 404 and completion_id in answer.json()["error"]["message"]
    assert (await theirs.chat.completions.list()).data == []
    assert (await client.chat.completions.retrieve(served.id)).metadata == {"tag": "mine"}
    await theirs.close()


async def test_past_its_quota_a_team_is_refused_before_anything_is_sampled(
    client,
    api,
    key,
    trained,
    settings,
    pytrio_fake,  # noqa: F811 (the fixture)
):
    settings.team_max_stored_completions = 1
    model = f"job-{trained['id']}"
    await chat(client, model)
    calls = len(pytrio_fake.calls)
    with pytest.raises(openai.RateLimitError) as error:
        await chat(client, model)
    assert error.value.body["code"] == "stored_completions_quota"
    assert "OPD_TEAM_MAX_STORED_COMPLETIONS" in error.value.body["message"]
    assert len(pytrio_fake.calls) == calls
    unstored = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=4)
    assert unstored.choices


async def test_a_replayed_request_keeps_nothing_more(client, api, key, trained, session):
    body = {"model": f"job-{trained['id']}", "messages": CHAT, "max_tokens": 4, "store": True}
    headers = auth(key) | {"Idempotency-Key": "stored-1"}
    first = await api.post("/v1/chat/completions", json=body, headers=headers)
    again = await api.post("/v1/chat/completions", json=body, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert first.json()["id"] == again.json()["id"]
    assert (await session.execute(select(func.count(StoredCompletion.id)))).scalar_one() == 1


async def test_stored_completions_and_feedback_go_with_their_team(
    client, api, key, trained, session
):
    served = await chat(client, f"job-{trained['id']}")
    await api.post(
        f"/v1/chat/completions/{served.id}/feedback", json={"rating": 1}, headers=auth(key)
    )
    row = (await session.execute(select(StoredCompletion))).scalar_one()
    loner = Team(name="loner")
    session.add(loner)
    await session.flush()
    moved = StoredCompletion(
        **row.model_dump(exclude={"id", "team_id", "public_id", "metadata_"}),
        team_id=loner.id,
        public_id="chatcmpl-" + "1" * 32,
    )
    session.add(moved)
    await session.flush()
    session.add(Feedback(completion_id=moved.id, team_id=loner.id, rating=-1))
    await session.commit()

    await session.execute(delete(ApiKey).where(ApiKey.team_id == loner.id))
    await session.execute(delete(Team).where(Team.id == loner.id))
    await session.commit()
    left = (await session.execute(select(StoredCompletion.public_id))).scalars().all()
    assert left == [served.id]
    assert (await session.execute(select(func.count(Feedback.id)))).scalar_one() == 1


def stored_job(dataset: dict[str, Any]) -> dict[str, Any]:
    return {
        "backend": "local",
        "student": {"base_model": "tiny-student"},
        "teacher": {"self": {"context": "feedback"}},
        "dataset": {"source": "stored_completions"} | dataset,
        "loop": {"steps": 1, "batch_size": 1, "group_size": 2},
    }


async def test_a_job_reads_the_rows_its_filter_picks_and_a_clone_reads_the_same(
    client, api, key, make_key, trained
):
    model = f"job-{trained['id']}"
    tagged = [await chat(client, model, metadata={"tag": "loop"}) for _ in range(3)]
    await chat(client, model, metadata={"tag": "other"})
    url = f"/v1/chat/completions/{tagged[0].id}/feedback"
    await api.post(url, json={"rating": -1, "correction": "Number only"}, headers=auth(key))
    await api.post(url, json={"rating": 1}, headers=auth(key))

    made = await api.post(
        "/v1/jobs", json=stored_job({"filter": {"metadata": {"tag": "loop"}}}), headers=auth(key)
    )
    assert made.status_code == 201, made.text
    dataset = made.json()["spec"]["dataset"]
    assert dataset["ids"] == [c.id for c in tagged]
    first = dataset["rows"][0]
    assert first["messages"] == CHAT and first["feedback"] == ["Number only"]
    assert first["answer"] == tagged[0].choices[0].message.content
    assert [r["feedback"] for r in dataset["rows"][1:]] == [[], []]
    rated = await api.post(
        "/v1/jobs", json=stored_job({"filter": {"rating": -1, "limit": 5}}), headers=auth(key)
    )
    assert rated.json()["spec"]["dataset"]["ids"] == [tagged[0].id]

    await chat(client, model, metadata={"tag": "loop"})  # stored after: the clone reads the same
    cloned = await api.post(f"/v1/jobs/{made.json()['id']}/clone", json={}, headers=auth(key))
    assert cloned.status_code == 201, cloned.text
    assert cloned.json()["spec"]["dataset"]["ids"] == dataset["ids"]

    for body, status, param in (
        ({"filter": {"metadata": {"tag": "none"}}}, 422, "dataset.filter"),
        ({"rows": [first]}, 422, "dataset.rows"),
        ({"ids": ["chatcmpl-" + "0" * 32]}, 404, "dataset.ids"),
    ):
        refused = await api.post("/v1/jobs", json=stored_job(body), headers=auth(key))
        assert refused.status_code == status, refused.text
        assert refused.json()["error"]["param"] == param
    stranger = await make_key()
    theirs = await api.post(
        "/v1/jobs", json=stored_job({"ids": [tagged[0].id]}), headers=auth(stranger)
    )
    assert theirs.status_code == 404 and theirs.json()["error"]["param"] == "dataset.ids"


# --- the playground's store -----------------------------------------------------------------


async def playground(api, key, job_id: int, **body: Any) -> httpx.Response:
    return await api.post(f"/v1/jobs/{job_id}/playground", json=body, headers=auth(key))


async def stored_count(session) -> int:
    return (await session.execute(select(func.count(StoredCompletion.id)))).scalar_one()


async def test_the_playground_keeps_each_models_completions_as_the_chat_door_does(
    client, api, key, trained, session
):
    """Each model asked for is one stored completion under its name, as
    `/v1/chat/completions` with `store: true` and that name would keep it; the answer
    names each; without `store` nothing is kept."""
    job = trained["id"]
    answered = await playground(
        api,
        key,
        job,
        prompt="1 + 1?",
        compare=["teacher", "base"],
        n=2,
        max_tokens=4,
        temperature=0.5,
        seed=7,
        store=True,
        metadata={"tag": "try"},
    )
    assert answered.status_code == 200, answered.text
    outputs = answered.json()["outputs"]
    ids = [output["stored_completion_id"] for output in outputs]
    assert len(set(ids)) == 3 and all(i.startswith("chatcmpl-") for i in ids)

    listed = await client.chat.completions.list(metadata={"tag": "try"})
    assert [c.id for c in listed.data] == ids
    assert [c.model for c in listed.data] == [f"job-{job}", f"job-{job}:teacher", f"job-{job}:base"]
    for output, kept in zip(outputs, listed.data, strict=True):
        read = await client.chat.completions.retrieve(kept.id)
        assert read.metadata == {"tag": "try"}
        assert [c.message.content for c in read.choices] == [
            c["text"] for c in output["completions"]
        ]
        for choice, completion in zip(read.choices, output["completions"], strict=True):
            assert [t.logprob for t in choice.logprobs.content] == pytest.approx(
                completion["logprobs"]
            )
        sampled = sum(len(c["token_ids"]) for c in output["completions"])
        assert (read.usage.prompt_tokens, read.usage.completion_tokens) == (
            output["prompt_tokens"],
            sampled,
        )
        turns = await client.chat.completions.messages.list(kept.id)
        assert [(m.role, m.content) for m in turns.data] == [("user", "1 + 1?")]
    rows = (await session.execute(select(StoredCompletion).order_by(StoredCompletion.id))).scalars()
    for row, output in zip(rows, outputs, strict=True):
        assert (row.kind, row.job_id) == ("chat", job)
        assert {k: row.request[k] for k in ("n", "temperature", "max_tokens", "seed")} == {
            "n": 2,
            "temperature": 0.5,
            "max_tokens": 4,
            "seed": 7,
        }
        assert row.tokens == [
            {"token_ids": c["token_ids"], "logprobs": c["logprobs"]} for c in output["completions"]
        ]

    chat = await playground(api, key, job, messages=CHAT, max_tokens=3, store=True)
    (output,) = chat.json()["outputs"]
    turns = await client.chat.completions.messages.list(output["stored_completion_id"])
    assert [(m.role, m.content) for m in turns.data] == [(m["role"], m["content"]) for m in CHAT]
    text = await playground(
        api, key, job, text="2 + 2 =", model="teacher", max_tokens=3, store=True
    )
    (output,) = text.json()["outputs"]
    kept = await client.chat.completions.retrieve(output["stored_completion_id"])
    assert kept.model == f"job-{job}:teacher"
    (turn,) = (await client.chat.completions.messages.list(kept.id)).data
    assert turn.content == output["prompt"] and "2 + 2 =" in turn.content

    before = await stored_count(session)
    unstored = await playground(api, key, job, prompt="1 + 1?", compare=["teacher"], max_tokens=3)
    assert unstored.status_code == 200, unstored.text
    assert [o["stored_completion_id"] for o in unstored.json()["outputs"]] == [None, None]
    assert await stored_count(session) == before


@pytest.mark.parametrize("job_spec", [SPEC | {"loop": SPEC["loop"] | {"save_every": 1}}])
async def test_a_step_the_playground_samples_is_kept_under_its_name(client, api, key, trained):
    listed = (await api.get(f"/v1/jobs/{trained['id']}/checkpoints", headers=auth(key))).json()
    step = next(c["step"] for c in listed["data"] if c["kind"] == "sampler")
    answered = await playground(
        api, key, trained["id"], prompt="1 + 1?", checkpoint=step, max_tokens=3, store=True
    )
    assert answered.status_code == 200, answered.text
    (output,) = answered.json()["outputs"]
    kept = await client.chat.completions.retrieve(output["stored_completion_id"])
    assert kept.model == f"job-{trained['id']}@step-{step}"
    by_model = await client.chat.completions.list(model=f"job-{trained['id']}@step-{step}")
    assert [c.id for c in by_model.data] == [kept.id]


async def test_the_playgrounds_stored_completions_are_its_teams_alone(
    client, api, key, make_key, trained
):
    answered = await playground(
        api, key, trained["id"], prompt="1 + 1?", max_tokens=3, store=True, metadata={"t": "1"}
    )
    (output,) = answered.json()["outputs"]
    stranger = await make_key()
    theirs = openai_on(api, stranger)
    assert (await theirs.chat.completions.list()).data == []
    assert (await theirs.chat.completions.list(metadata={"t": "1"})).data == []
    with pytest.raises(openai.NotFoundError):
        await theirs.chat.completions.retrieve(output["stored_completion_id"])
    await theirs.close()
    refused = await playground(api, stranger, trained["id"], prompt="x", store=True)
    assert refused.status_code == 404, refused.text
    assert [c.id for c in (await client.chat.completions.list()).data] == [
        output["stored_completion_id"]
    ]


async def test_past_its_quota_the_playground_is_refused_before_anything_is_sampled(
    api,
    key,
    trained,
    settings,
    session,
    pytrio_fake,  # noqa: F811 (the fixture)
):
    """A request keeps one completion per model (its n choices in it): it must fit the
    room left whole."""
    settings.team_max_stored_completions = 2
    calls = len(pytrio_fake.calls)
    three = await playground(
        api, key, trained["id"], prompt="1 + 1?", compare=["teacher", "base"], store=True
    )
    assert three.status_code == 429, three.text
    error = three.json()["error"]
    assert (error["code"], error["param"]) == ("stored_completions_quota", "store")
    assert "OPD_TEAM_MAX_STORED_COMPLETIONS" in error["message"]
    assert len(pytrio_fake.calls) == calls and await stored_count(session) == 0

    two = await playground(
        api, key, trained["id"], prompt="1 + 1?", max_tokens=3, n=2, compare=["base"], store=True
    )
    assert two.status_code == 200, two.text
    assert await stored_count(session) == 2
    calls = len(pytrio_fake.calls)
    full = await playground(api, key, trained["id"], prompt="1 + 1?", max_tokens=3, store=True)
    assert full.status_code == 429 and len(pytrio_fake.calls) == calls
    unstored = await playground(api, key, trained["id"], prompt="1 + 1?", max_tokens=3)
    assert unstored.status_code == 200, unstored.text
    assert await stored_count(session) == 2


async def test_a_replayed_playground_request_keeps_nothing_more(api, key, trained, session):
    body = {"prompt": "1 + 1?", "max_tokens": 3, "compare": ["teacher"], "store": True}
    headers = auth(key) | {"Idempotency-Key": "stored-playground-1"}
    url = f"/v1/jobs/{trained['id']}/playground"
    first = await api.post(url, json=body, headers=headers)
    again = await api.post(url, json=body, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    ids = [o["stored_completion_id"] for o in first.json()["outputs"]]
    assert [o["stored_completion_id"] for o in again.json()["outputs"]] == ids
    assert await stored_count(session) == 2


async def test_the_sdks_playground_stores_and_the_sdk_lists_them(api, key, trained):
    transport = httpx.ASGITransport(api._transport.app)
    async with AsyncClient("http://opd", key.key, transport=transport) as opd:
        answer = await opd.jobs.playground(
            trained["id"],
            "1 + 1?",
            max_tokens=3,
            compare=["teacher"],
            store=True,
            metadata={"from": "sdk"},
        )
        ids = [output.stored_completion_id for output in answer.outputs]
        listed = [c async for c in opd.stored_completions.list(metadata={"from": "sdk"})]
        assert [c.id for c in listed] == ids and None not in ids
        assert [c.model for c in listed] == [f"job-{trained['id']}", f"job-{trained['id']}:teacher"]
        plain = await opd.jobs.playground(trained["id"], "1 + 1?", max_tokens=3)
        assert plain.outputs[0].stored_completion_id is None
        assert len([c async for c in opd.stored_completions.list()]) == 2
    refused = await playground(
        api, key, trained["id"], prompt="x", store=True, metadata={"k" * 65: "v"}
    )
    assert refused.status_code == 422 and refused.json()["error"]["param"].startswith("metadata")


async def test_the_dashboards_playground_stores_its_answers_when_asked(
    client, api, key, trained, settings, session
):
    """The job page's "Store these answers": each model's answers kept as the API's
    `store` keeps them, each named in the fragment and listed on the Completions page;
    unticked, nothing is kept; past the quota, a 429 fragment that says so."""
    sign_in = await api.get("/ui/sign-in")
    await post_form(api, "/ui/sign-in", sign_in, key=key.key)
    page = await api.get(f"/ui/jobs/{trained['id']}")
    assert 'name="store"' in page.text and "Store these answers" in page.text
    url = f"/ui/jobs/{trained['id']}/try"
    form = {"prompt": "1 + 1?", "checkpoint": "final", "max_tokens": "3", "compare_teacher": "1"}

    tried = await post_form(api, url, page, **form, store="1")
    assert tried.status_code == 200, tried.text
    shown = re.findall(r'class="stored-completion"><code>(chatcmpl-\w+)</code>', tried.text)
    listed = (await client.chat.completions.list()).data
    assert [c.id for c in listed] == shown and len(shown) == 2
    assert [c.model for c in listed] == [f"job-{trained['id']}", f"job-{trained['id']}:teacher"]
    completions = await api.get("/ui/completions")
    assert all(f'data-completion-id="{one}"' in completions.text for one in shown)

    unticked = await post_form(api, url, page, **form)
    assert unticked.status_code == 200 and "stored as" not in unticked.text
    assert await stored_count(session) == 2
    settings.team_max_stored_completions = 3
    refused = await post_form(api, url, page, **form, store="1")
    assert refused.status_code == 429 and "OPD_TEAM_MAX_STORED_COMPLETIONS" in refused.text
    assert await stored_count(session) == 2
