"""The job page's Try it panel over HTTP, with no worker running: it shows for keys that
may sample, its form is checked as the API checks a request, and a request no worker
takes says so. (With a worker: tests/e2e/test_playground.py and test_dashboard.py.)"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from app.auth.schemas import Scope
from app.core.worker_calls import quick_queue
from app.jobs.store import claim_job
from app.records.store import record_checkpoint
from tests.app.conftest import auth, serve
from tests.app.web.conftest import csrf_of, post_form


@pytest.fixture
async def browser(settings) -> AsyncIterator[httpx.AsyncClient]:
    """A browser on an API whose playground waits 0.3 s for a worker."""
    async with serve(settings.model_copy(update={"sample_timeout": 0.3})) as client:
        yield client


async def signed_in_job_page(browser, session, submit, key) -> tuple[dict, httpx.Response]:
    job = await submit(loop={"steps": 4})
    await claim_job(session, job["id"], "w", heartbeat_timeout=60)
    await record_checkpoint(session, job["id"], "w", 2, "sampler", "/w/2")
    sign_in = await browser.get("/ui/sign-in")
    await post_form(browser, "/ui/sign-in", sign_in, key=key.key)
    return job, await browser.get(f"/ui/jobs/{job['id']}")


async def test_the_panel_samples_through_a_worker_and_says_when_none_answers(
    browser, session, submit, key
):
    job, page = await signed_in_job_page(browser, session, submit, key)
    latest = '<option value="2" selected>step 2</option>'
    assert 'id="try-form"' in page.text and latest in page.text
    url = f"/ui/jobs/{job['id']}/try"

    waited = await post_form(browser, url, page, prompt="What is 2 + 3?", checkpoint="2")
    bad = await post_form(browser, url, page, prompt="What is 2 + 3?", checkpoint="2", n="0")
    missing = await post_form(browser, url, page, prompt="What is 2 + 3?", checkpoint="final")
    forged = await browser.post(url, data={"csrf_token": "forged", "prompt": "x"})

    assert waited.status_code == 504 and "no worker answered within 0.3 s" in waited.text
    assert bad.status_code == 422 and "n: should be greater than or equal to 1, not 0" in bad.text
    assert missing.status_code == 422 and "has no final weights" in missing.text
    assert forged.status_code == 403


async def test_a_read_key_sees_no_panel_and_cannot_sample(browser, session, submit, key, make_key):
    reader = await make_key(key.team.name, scope=Scope.read)
    job, page = await signed_in_job_page(browser, session, submit, reader)
    assert page.status_code == 200 and 'id="try-form"' not in page.text
    refused = await browser.post(
        f"/ui/jobs/{job['id']}/try", data={"csrf_token": csrf_of(page), "prompt": "x"}
    )
    assert refused.status_code == 403 and "submit&#39; scope" in refused.text


async def test_past_the_teams_waiting_bound_the_panel_says_so_with_a_429(
    settings, session, submit, key, redis, queue_name
):
    """The panel and the API share the team's places: one API request waits, so the panel's
    is refused at once."""
    async with serve(settings.model_copy(update={"team_max_waiting": 1})) as browser:
        job, page = await signed_in_job_page(browser, session, submit, key)
        body = {"prompt": "a", "checkpoint": 2, "timeout_seconds": 30}
        waiting = asyncio.create_task(
            browser.post(f"/v1/jobs/{job['id']}/playground", json=body, headers=auth(key))
        )
        while not await redis.zcard(quick_queue(queue_name)) and not waiting.done():
            await asyncio.sleep(0.02)
        url = f"/ui/jobs/{job['id']}/try"
        refused = await post_form(browser, url, page, prompt="What is 2 + 3?", checkpoint="2")
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "5"
    assert "waiting for a worker as it may (1, OPD_TEAM_MAX_WAITING)" in refused.text


async def test_the_panel_offers_the_latest_weights_first(browser, session, submit, key) -> None:
    job, _ = await signed_in_job_page(browser, session, submit, key)
    await record_checkpoint(session, job["id"], "w", 4, "sampler", "/w/4")
    await record_checkpoint(session, job["id"], "w", 4, "final", "/w/final")
    page = await browser.get(f"/ui/jobs/{job['id']}")
    options = re.findall(
        r'<option value="([^"]+)"( selected)?>',
        page.text.split('name="checkpoint"')[1].split("</select>")[0],
    )
    assert options[0] == ("final", " selected")  # it used to offer the oldest, step 2
    assert [value for value, _ in options] == ["final", "4", "2"]


async def test_a_self_teacher_job_asks_for_the_reference_its_teacher_reads(
    browser, session, submit, key
):
    job = await submit(
        student={"base_model": "tiny-student"},
        teacher={"base_model": "tiny-student", "self": {"system": "Be brief.", "reference": True}},
        dataset={"source": "inline", "prompts": ["What is 1 + 1?"], "answers": ["2"]},
        loop={"steps": 4},
    )
    await claim_job(session, job["id"], "w", heartbeat_timeout=60)
    await record_checkpoint(session, job["id"], "w", 2, "sampler", "/w/2")
    sign_in = await browser.get("/ui/sign-in")
    await post_form(browser, "/ui/sign-in", sign_in, key=key.key)
    page = await browser.get(f"/ui/jobs/{job['id']}")

    assert 'name="reference"' in page.text
    assert "self (base weights + context)" in page.text
    without = await post_form(
        browser,
        f"/ui/jobs/{job['id']}/try",
        page,
        prompt="What is 2 + 3?",
        checkpoint="2",
        compare_teacher="1",
    )
    assert without.status_code == 422 and "give it as reference" in without.text
