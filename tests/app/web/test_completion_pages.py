"""The stored-completions page over HTTP, on both databases: the team's stored
completions newest first with the question each answered, filtered by model, a metadata
pair, a rating and whether feedback was given; thumbs and a correction box give feedback
(CSRF-checked) and come back to the list as it was filtered; a read key sees the page but
no forms; another team's completion is neither listed nor rated."""

from __future__ import annotations

import html
import re
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


def link(page, rel: str) -> str | None:
    """The page's pager link `rel` (its address as the browser reads it), or None."""
    found = re.search(rf'<a rel="{rel}" href="([^"]+)"', page.text)
    return None if found is None else html.unescape(found.group(1))


async def test_older_pages_past_the_newest_hundred_keep_the_filters(
    client, key, make_key, sign_in, session, job
):
    rows = [stored(key.team.id, job.id, n, "job-1", app="a" if n % 2 else "b") for n in range(230)]
    ids = await keep(session, *rows)
    theirs = await make_key()
    (foreign,) = await keep(session, stored(theirs.team.id, job.id, 999, "job-1", app="a"))
    await sign_in(key)

    first = await client.get("/ui/completions")
    assert listed(first) == ids[::-1][:100] and link(first, "first") is None
    second = await client.get(link(first, "next"))
    assert link(first, "next") == f"/ui/completions?after={ids[130]}"
    assert listed(second) == ids[::-1][100:200]
    third = await client.get(link(second, "next"))
    assert listed(third) == ids[::-1][200:] and link(third, "next") is None
    assert link(third, "first") == "/ui/completions"

    odd = [one for n, one in enumerate(ids) if n % 2][::-1]
    filtered = await client.get("/ui/completions", params={"metadata": "app=a", "model": "job-1"})
    assert listed(filtered) == odd[:100]
    older = await client.get(link(filtered, "next"))
    assert link(filtered, "next") == (
        f"/ui/completions?model=job-1&metadata=app%3Da&after={odd[99]}"
    )
    assert listed(older) == odd[100:] and link(older, "next") is None
    assert link(older, "first") == "/ui/completions?model=job-1&metadata=app%3Da"
    rated = await post_form(
        client,
        f"/ui/completions/{odd[100]}/feedback",
        older,
        rating="1",
        query=older.url.query.decode(),
    )
    assert rated.headers["location"] == f"{link(filtered, 'next')}#{odd[100]}"

    for after in (foreign, "chatcmpl-" + "0" * 32, "not an id"):
        refused = await client.get("/ui/completions", params={"after": after})
        assert refused.status_code == 400, refused.text
        assert "none of your team&#39;s stored completions" in refused.text
        assert "What is 999 + 0?" not in refused.text
    too_long = await client.get("/ui/completions", params={"after": "x" * 65})
    assert too_long.status_code == 400 and "after" in too_long.text
