"""The stored-completions page over HTTP, on both databases: the team's stored
completions newest first with the question each answered, filtered by model, a metadata
pair, a rating and whether feedback was given; thumbs and a correction box give feedback
(CSRF-checked) and come back to the list as it was filtered; a read key sees the page but
no forms; another team's completion is neither listed nor rated."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select

from app.auth.schemas import Scope
from app.stored_completions.tables import Feedback, StoredCompletion
from tests.app.web.conftest import post_form


def stored(team_id: int, job_id: int, n: int, model: str, **labels: str) -> StoredCompletion:
    """A stored chat completion as the chat door keeps one."""
    public_id = f"chatcmpl-{uuid.uuid4().hex}"
    answer: dict[str, Any] = {"role": "assistant", "content": f"The answer is {n}."}
    return StoredCompletion(
        public_id=public_id,
        team_id=team_id,
        job_id=job_id,
        model=model,
        kind="chat",
        request={"messages": [{"role": "user", "content": f"What is {n} + 0?"}]},
        response={
            "id": public_id,
            "object": "chat.completion",
            "created": 1796000000 + n,
            "model": model,
            "choices": [{"index": 0, "message": answer, "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
        },
        tokens=[],
        metadata_=labels,
    )


async def keep(session, *rows: StoredCompletion) -> list[str]:
    session.add_all(rows)
    await session.commit()
    return [row.public_id for row in rows]


async def feedback_of(session, team_id: int) -> list[Feedback]:
    query = select(Feedback).where(Feedback.team_id == team_id).order_by(Feedback.id)
    return list((await session.execute(query)).scalars())


def listed(page) -> list[str]:
    assert page.status_code == 200, page.text
    return [
        line.split('data-completion-id="')[1].split('"')[0]
        for line in page.text.splitlines()
        if 'data-completion-id="' in line
    ]


async def test_thumbs_and_a_correction_give_feedback_and_the_filters_pick(
    client, key, sign_in, session, job
):
    first, second, third = await keep(
        session,
        stored(key.team.id, job.id, 1, "job-1", app="support"),
        stored(key.team.id, job.id, 2, "support-bot", app="support"),
        stored(key.team.id, job.id, 3, "job-1", app="other"),
    )
    await sign_in(key)
    page = await client.get("/ui/completions")
    assert listed(page) == [third, second, first]
    assert "What is 2 + 0?" in page.text and "The answer is 2." in page.text
    assert 'href="/ui/completions"' in page.text  # in the navigation
    assert f'action="/ui/completions/{first}/feedback"' in page.text

    filtered = await client.get("/ui/completions", params={"metadata": "app=support"})
    assert listed(filtered) == [second, first]
    thumbs = await post_form(
        client,
        f"/ui/completions/{first}/feedback",
        filtered,
        rating="-1",
        query="metadata=app%3Dsupport&other=x",
    )
    assert thumbs.status_code == 303
    assert thumbs.headers["location"] == f"/ui/completions?metadata=app%3Dsupport#{first}"
    corrected = await post_form(
        client,
        f"/ui/completions/{second}/feedback",
        filtered,
        correction="  Answer with the number only ",
    )
    assert corrected.status_code == 303

    given = await feedback_of(session, key.team.id)
    assert [(f.rating, f.correction) for f in given] == [
        (-1, None),
        (None, "Answer with the number only"),
    ]
    assert given[0].author == f"key {key.key.split('_')[1]}"
    for params, expected in [
        ({"rating": "-1"}, [first]),
        ({"feedback": "yes"}, [second, first]),
        ({"feedback": "no"}, [third]),
        ({"model": "support-bot"}, [second]),
        ({"model": "job-1", "metadata": "app=other"}, [third]),
    ]:
        assert listed(await client.get("/ui/completions", params=params)) == expected, params
    page = await client.get("/ui/completions", params={"feedback": "yes"})
    assert "Answer with the number only" in page.text and "👎" in page.text


async def test_bad_filters_and_feedback_are_a_400_page_that_says_why(
    client, key, sign_in, session, job
):
    (only,) = await keep(session, stored(key.team.id, job.id, 1, "job-1"))
    await sign_in(key)
    for params, words in [
        ({"metadata": "no-equals"}, "KEY=VALUE"),
        ({"rating": "2"}, "rating"),
    ]:
        page = await client.get("/ui/completions", params=params)
        assert page.status_code == 400 and words in page.text, page.text
    page = await client.get("/ui/completions")
    empty = await post_form(client, f"/ui/completions/{only}/feedback", page)
    assert empty.status_code == 400 and "give a rating, a correction or both" in empty.text
    forged = await client.post(
        f"/ui/completions/{only}/feedback", data={"csrf_token": "x", "rating": "1"}
    )
    assert forged.status_code == 403
    assert await feedback_of(session, key.team.id) == []


async def test_a_read_key_sees_no_forms_and_another_teams_completion_is_not_there(
    client, key, make_key, sign_in, session, job
):
    (theirs,) = await keep(session, stored(key.team.id, job.id, 1, "job-1"))
    stranger = await make_key()
    await sign_in(stranger)
    page = await client.get("/ui/completions")
    assert listed(page) == [] and "No stored completions" in page.text
    refused = await post_form(client, f"/ui/completions/{theirs}/feedback", page, rating="1")
    assert refused.status_code == 404 and theirs in refused.text
    assert await feedback_of(session, key.team.id) == []

    reader = await make_key(scope=Scope.read)
    reader_team_row = stored(reader.team.id, job.id, 2, "job-1")
    await keep(session, reader_team_row)
    await sign_in(reader)
    page = await client.get("/ui/completions")
    assert listed(page) == [reader_team_row.public_id]
    assert '/feedback"' not in page.text and 'csrf_token" value' not in page.text.split("<main>")[1]
