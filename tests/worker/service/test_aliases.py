"""Model aliases on the OpenAI-compatible doors, with the `openai` package, on SQLite and
Postgres: a spec's `alias` names the newest succeeded job of the team that carries it (a
queued one does not take it), the completions answer under it with the job that
served, `/v1/models` lists and reads it, the stored completions are found by the name the
client sent, and another team's alias is a model that does not exist."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.app.conftest import auth
from tests.worker.service.test_quick import SPEC, pytrio_fake  # noqa: F401 (fixtures)
from tests.worker.service.test_stored_completions import CHAT, openai_on
from worker.service.tasks import WorkerContext, run_job

ALIAS = "support-bot"


@pytest.fixture
def job_spec() -> dict[str, Any]:
    return SPEC | {"alias": ALIAS}


async def served_by(client: openai.AsyncOpenAI, model: str) -> str:
    answer = await client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=3, store=True
    )
    return answer.model


async def test_an_alias_names_the_newest_succeeded_job_that_carries_it(
    api, key, make_key, trained, settings, sessions, queue
):
    client = openai_on(api, key)
    first = f"job-{trained['id']}"
    assert await served_by(client, ALIAS) == first

    retrained = (await api.post("/v1/jobs", json=SPEC | {"alias": ALIAS}, headers=auth(key))).json()
    assert retrained["status"] == "queued"
    assert await served_by(client, ALIAS) == first  # not yet succeeded: the name stays
    context = WorkerContext(settings, sessions, queue, "worker-1")
    assert await run_job({"opd": context}, retrained["id"]) == f"job {retrained['id']}: succeeded"
    assert await served_by(client, ALIAS) == f"job-{retrained['id']}"

    text = await client.completions.create(model=ALIAS, prompt="1 + 1 =", max_tokens=2)
    assert text.model == f"job-{retrained['id']}"
    listed = [model.id async for model in client.models.list()]
    assert listed[0] == ALIAS and first in listed
    assert (await client.models.retrieve(ALIAS)).id == ALIAS
    kept = [c.model async for c in client.chat.completions.list(model=ALIAS)]
    assert kept == [first, first, f"job-{retrained['id']}"]  # as served, found by the alias

    stranger = openai_on(api, await make_key())
    with pytest.raises(openai.NotFoundError) as refused:
        await served_by(stranger, ALIAS)
    assert refused.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        await stranger.models.retrieve(ALIAS)
    assert ALIAS not in [model.id async for model in stranger.models.list()]
    await stranger.close()
    await client.close()


@pytest.mark.parametrize("alias", ["job-3", "Support Bot", "", "a" * 65, "-bot"])
async def test_an_alias_that_could_not_be_a_name_is_refused_with_the_field(api, key, alias):
    answer = await api.post("/v1/jobs", json=SPEC | {"alias": alias}, headers=auth(key))
    assert answer.status_code == 422, answer.text
    assert "alias" in answer.text
