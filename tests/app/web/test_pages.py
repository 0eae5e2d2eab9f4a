"""The dashboard over HTTP (SQLite and Postgres): sign-in and its cookie, team scoping,
CSRF, security headers, escaping, the table, the job page, actions, new jobs, compare."""

from __future__ import annotations

import re

import httpx
import pytest
from sqlalchemy import func, select

from app.auth.sessions import NONCE_COOKIE, SESSION_COOKIE
from app.jobs.store import claim_job, complete_job, heartbeat
from app.jobs.tables import Job
from app.records.store import record_checkpoint, record_samples, record_step
from kernel.progress import JobProgress, Phase
from kernel.samples import KeptSample
from tests.app.conftest import auth, small_spec, upgraded_spec
from tests.app.web.conftest import NAMED_YAML, csrf_of, post_form

WORKER = "worker-web"


def set_cookie_header(response: httpx.Response, name: str) -> str:
    headers = [h for h in response.headers.get_list("set-cookie") if h.startswith(f"{name}=")]
    assert headers, f"no {name} cookie set"
    return headers[0]


async def test_pages_need_a_session_and_come_back_after_sign_in(client, key):
    response = await client.get("/ui/jobs?status=queued")
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/sign-in?next=/ui/jobs%3Fstatus%3Dqueued"
    page = await client.get(response.headers["location"])
    assert 'name="next" value="/ui/jobs?status=queued"' in page.text
    signed = await post_form(
        client, "/ui/sign-in", page, key=key.key, next="/ui/jobs?status=queued"
    )
    assert signed.status_code == 303
    assert signed.headers["location"] == "/ui/jobs?status=queued"
    assert (await client.get("/ui/jobs")).status_code == 200


async def test_the_session_cookie_is_http_only_strict_expiring_and_holds_no_key(client, key):
    page = await client.get("/ui/sign-in")
    signed = await post_form(client, "/ui/sign-in", page, key=key.key)
    cookie = set_cookie_header(signed, SESSION_COOKIE)
    attributes = [part.strip().lower() for part in cookie.split(";")]
    assert "httponly" in attributes
    assert "samesite=strict" in attributes
    assert any(part.startswith("max-age=") and int(part[8:]) > 0 for part in attributes)
    assert "secure" not in attributes, "plain HTTP: a Secure cookie would never come back"
    assert key.key not in cookie
    assert "localStorage" not in (await client.get("/ui/static/dashboard.js")).text


async def test_the_cookie_is_secure_under_https(settings, key):
    from tests.app.conftest import serve

    async with serve(settings) as client:
        client.base_url = httpx.URL("https://opd")
        page = await client.get("/ui/sign-in")
        signed = await post_form(client, "/ui/sign-in", page, key=key.key)
    assert "secure" in set_cookie_header(signed, SESSION_COOKIE).lower().split("; ")


async def test_a_bad_key_is_refused_and_next_never_leaves_the_site(client, key):
    page = await client.get("/ui/sign-in")
    refused = await post_form(client, "/ui/sign-in", page, key=key.key + "x")
    assert refused.status_code == 401
    assert "Unknown or revoked API key." in refused.text
    assert SESSION_COOKIE not in refused.headers.get("set-cookie", "")
    away = await post_form(client, "/ui/sign-in", page, key=key.key, next="//evil.example/x")
    assert away.headers["location"] == "/ui/jobs"


async def test_every_form_needs_its_csrf_token(client, key, sign_in, submit):
    job = await submit()
    await sign_in(key)
    path = f"/ui/jobs/{job['id']}/cancel"
    assert (await client.post(path, data={"confirm": "yes"})).status_code == 403
    assert (await client.post(path, data={"csrf_token": "forged"})).status_code == 403
    page = await client.get(f"/ui/jobs/{job['id']}")
    other_browser = httpx.AsyncClient(transport=client._transport, base_url=client.base_url)
    other_browser.cookies.set(SESSION_COOKIE, client.cookies[SESSION_COOKIE])
    other_browser.cookies.set(NONCE_COOKIE, "another-browser")
    stolen = await other_browser.post(path, data={"csrf_token": csrf_of(page)})
    assert stolen.status_code == 403, "a token is bound to its browser's nonce"
    json_body = await client.post(path, json={"csrf_token": csrf_of(page)})
    assert json_body.status_code == 415
    done = await post_form(client, path, page)
    assert done.status_code == 303
    assert (await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()["status"] == (
        "cancelled"
    )


async def test_non_ascii_bytes_in_a_token_cookie_or_csrf_field_are_refused(
    client, key, sign_in, submit
):
    """A header or cookie may carry any byte (Starlette reads them as Latin-1): a signature
    holding one is a forgery like any other, a 401 or a sign-in or a 403, never a 500."""
    job = await submit()
    stranger = httpx.AsyncClient(transport=client._transport, base_url=client.base_url)
    for token in (b"opdjob_a.\xe9", b"a.\xe9", b"\xe9"):
        bearer = await stranger.get("/v1/jobs", headers={"Authorization": b"Bearer " + token})
        assert bearer.status_code == 401, bearer.text
    cookie = {"Cookie": f"{SESSION_COOKIE}=a.\xe9".encode("latin-1")}
    assert (await stranger.get("/v1/jobs", headers=cookie)).status_code == 401
    page = await stranger.get("/ui/jobs", headers=cookie)
    assert page.status_code == 303 and "/ui/sign-in" in page.headers["location"]
    await sign_in(key)
    for forged in ("\u00e9", "\u2603" * 43):
        cancel = await client.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf_token": forged})
        assert cancel.status_code == 403, cancel.text
    upload = await client.post(
        "/ui/files/upload?filename=a.jsonl", content=b"{}", headers={"X-CSRF-Token": b"\xe9"}
    )
    assert upload.status_code == 403, upload.text


async def test_pages_carry_a_strict_content_security_policy(client, key, sign_in):
    await sign_in(key)
    response = await client.get("/ui/jobs")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in response.text, "no inline script, or the policy would block it"
    api = await client.get("/v1/jobs", headers=auth(key))
    assert "content-security-policy" not in api.headers, "the JSON API is unchanged"


async def test_sign_out_ends_the_session(client, key, sign_in):
    await sign_in(key)
    page = await client.get("/ui/jobs")
    out = await post_form(client, "/ui/sign-out", page)
    assert out.status_code == 303
    assert set_cookie_header(out, SESSION_COOKIE).startswith(f'{SESSION_COOKIE}=""')
    assert (await client.get("/ui/jobs")).status_code == 303


async def test_the_table_shows_the_team_its_jobs_and_an_admin_every_team(
    client, key, make_key, sign_in, submit
):
    other = await make_key()
    mine = await submit(name="mine-1")
    theirs = await submit(as_key=other, name="theirs-1")
    await sign_in(key)
    page = (await client.get("/ui/jobs")).text
    assert f'href="/ui/jobs/{mine["id"]}"' in page
    assert f'href="/ui/jobs/{theirs["id"]}"' not in page
    rows = await client.get(f"/ui/jobs/rows?ids={mine['id']},{theirs['id']}")
    assert f'data-job-id="{mine["id"]}"' in rows.text
    assert f'data-job-id="{theirs["id"]}"' not in rows.text
    assert (await client.get(f"/ui/jobs/{theirs['id']}")).status_code == 404
    admin = await make_key(admin=True)
    await sign_in(admin)
    page = (await client.get("/ui/jobs")).text
    assert f'href="/ui/jobs/{theirs["id"]}"' in page
    assert (await client.get(f"/ui/jobs/{theirs['id']}")).status_code == 200


async def test_filter_search_and_pagination(client, key, sign_in, submit, session):
    for index in range(27):
        await submit(name=f"sweep_{index:02d}")
    lone = await submit(name="lonely-run")
    await sign_in(key)
    first = (await client.get("/ui/jobs?q=SWEEP_")).text
    assert "page 1 of 2" in first
    assert "sweep_26" in first and "sweep_01" not in first and "lonely-run" not in first
    second = (await client.get("/ui/jobs?q=sweep_&page=2")).text
    assert "sweep_01" in second and "sweep_26" not in second
    assert "sweep%" not in second
    assert "lonely-run" not in (await client.get("/ui/jobs?q=%25")).text, "% is literal"
    await client.post(f"/v1/jobs/{lone['id']}/pause", headers=auth(key))
    paused = (await client.get("/ui/jobs?status=paused")).text
    assert "lonely-run" in paused and "sweep_26" not in paused
    assert (await client.get("/ui/jobs?status=bogus")).status_code == 400
    assert (await client.get("/ui/jobs?page=0")).status_code == 400


async def test_the_job_page_shows_progress_metrics_events_checkpoints_and_spec(
    client, key, sign_in, submit, session
):
    job = await submit(loop={"steps": 10}, metadata={"note": "<script>alert(1)</script>"})
    await claim_job(session, job["id"], WORKER, heartbeat_timeout=60)
    for step in range(4):
        await record_step(
            session, job["id"], WORKER, step, {"opd/reverse_kl_mean": 1.5 - step / 10}
        )
    await record_checkpoint(session, job["id"], WORKER, 3, "state", "/artifacts/job/state-3")
    await record_checkpoint(session, job["id"], WORKER, 3, "sampler", "/artifacts/job/sampler-3")
    await sign_in(key)
    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    assert "4 / 10" in page
    assert re.search(r'id="job-kl">1.2<', page), "the latest reverse KL"
    assert "/artifacts/job" not in page and "Copy path" not in page, "no server path"
    downloads = re.findall(rf'href="(/v1/jobs/{job["id"]}/checkpoints/\d+/download)"', page)
    assert len(downloads) == 2, "each checkpoint offers its archive"
    export = f"opd export {job['id']} job-{job['id']}-step-3 --checkpoint 3"
    assert page.count(f'data-copy="{export}"') == 1, "sampler weights offer the export command"
    archive = await client.get(downloads[0])
    assert archive.status_code == 409, "the session was let in (the folder is no real one)"
    assert "Attempt 1 started" in page or "started" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, "user strings are escaped"
    assert "<script>alert(1)" not in page
    assert "ETA" in page
    assert f'action="/ui/jobs/{job["id"]}/pause"' in page
    assert f'action="/ui/jobs/{job["id"]}/resume"' not in page, "only actions that apply"
    config = re.search(r'id="chart-config">(.*?)</script>', page).group(1)
    assert '"reverse-kl"' in config and '"next_step": 4' in config
    assert '"total_steps": 10' in config, "the charts span the job's steps from the start"


async def test_a_running_job_says_what_it_does_now_and_the_time_left_evals_included(
    client, key, sign_in, submit, session
):
    """A real model's eval took minutes under "0 / 10 steps · ETA …" with nothing said: the
    heartbeat now carries what the run does (an eval, prompt by prompt) and its time left."""
    job = await submit(loop={"steps": 10})
    await claim_job(session, job["id"], WORKER, heartbeat_timeout=60)
    doing = JobProgress(
        phase=Phase.evaluating, step=0, eval_done=3, eval_total=8, eta_seconds=125.0
    )
    await heartbeat(session, job["id"], WORKER, doing)
    await sign_in(key)

    body = (await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()
    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    await complete_job(session, job["id"], WORKER, "/weights")
    ended = (await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()

    assert body["progress"] == {
        "phase": "evaluating",
        "step": 0,
        "eval_done": 3,
        "eval_total": 8,
        "eta_seconds": 125.0,
        "doing": "evaluating after step 0: 3/8 prompts",
    }
    assert 'id="job-now">evaluating after step 0: 3/8 prompts<' in page
    assert 'id="job-eta">2m 05s<' in page
    assert ended["status"] == "succeeded" and ended["progress"] is None


async def test_the_usage_page_shows_the_tokens_of_a_team_without_a_budget(
    client, key, sign_in, submit, session
):
    """It showed only budgets: a team without one saw no usage at all (`opd usage` did)."""
    job = await submit()
    await claim_job(session, job["id"], WORKER, heartbeat_timeout=60)
    usage = {"usage/sampled_tokens": 1200.0, "usage/teacher_tokens": 3400.0}
    await record_step(session, job["id"], WORKER, 0, {"opd/reverse_kl_mean": 1.0, **usage})
    await sign_in(key)

    page = (await client.get("/ui/usage")).text

    assert 'id="no-budget"' in page
    assert re.search(r'id="usage-total">4,600<', page), "1,200 sampled + 3,400 scored"


async def test_the_table_shows_the_latest_reverse_kl_and_eval_accuracy(
    client, key, sign_in, submit, session
):
    job = await submit(loop={"steps": 10})
    await claim_job(session, job["id"], WORKER, heartbeat_timeout=60)
    await record_step(
        session, job["id"], WORKER, 0, {"opd/reverse_kl_mean": 1.5, "eval/accuracy": 0.25}
    )
    await record_step(session, job["id"], WORKER, 1, {"opd/reverse_kl_mean": 0.875})
    await sign_in(key)
    rows = (await client.get(f"/ui/jobs/rows?ids={job['id']}")).text
    cells = re.findall(r'<td class="num[^"]*">([^<]*)</td>', rows)
    assert "0.875" in cells and "0.25" in cells, cells
    assert "2 / 10" in rows
    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    assert re.search(r'id="job-kl">0.875<', page)
    assert "Held-out accuracy</dt><dd>0.25 → 0.25" in page


async def test_kept_rollouts_show_each_token_shaded_and_escaped(
    client, key, sign_in, submit, session
):
    job = await submit(loop={"steps": 10})
    await sign_in(key)
    assert 'id="rollouts"' not in (await client.get(f"/ui/jobs/{job['id']}")).text
    await claim_job(session, job["id"], WORKER, heartbeat_timeout=60)
    kept = KeptSample("What is <b>2+3</b>?", "5", ["<", "5", ">"], [0.05, 1.2, 3.0])
    await record_samples(session, job["id"], WORKER, 0, [kept])
    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    section = page[page.index('id="rollouts"') :]
    assert "What is &lt;b&gt;2+3&lt;/b&gt;?" in section and "<b>2+3" not in section
    shades = re.findall(r'class="tok kl-(\d)"[^>]*>([^<]*)<', section)
    assert shades == [("0", "&lt;"), ("3", "5"), ("4", "&gt;")]


async def test_a_failed_job_shows_its_code_and_message(client, key, sign_in, submit, session):
    from app.jobs.store import fail_job

    job = await submit()
    await claim_job(session, job["id"], WORKER, heartbeat_timeout=60)
    await fail_job(session, job["id"], WORKER, "backend_auth", "set PYTRIO_API_KEY & retry")
    await sign_in(key)
    page = (await client.get(f"/ui/jobs/{job['id']}")).text
    assert "backend_auth" in page
    assert "set PYTRIO_API_KEY &amp; retry" in page


async def test_pause_and_resume_from_the_page_queue_the_job_again(
    client, key, sign_in, submit, redis, queue_name
):
    job = await submit()
    await sign_in(key)
    page = await client.get(f"/ui/jobs/{job['id']}")
    assert (await post_form(client, f"/ui/jobs/{job['id']}/pause", page)).status_code == 303
    read = await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))
    assert read.json()["status"] == "paused"
    page = await client.get(f"/ui/jobs/{job['id']}")
    assert f'action="/ui/jobs/{job["id"]}/resume"' in page.text
    assert (await post_form(client, f"/ui/jobs/{job['id']}/resume", page)).status_code == 303
    read = await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))
    assert read.json()["status"] == "queued"
    assert await redis.zcard(queue_name) == 2, "the resumed job was sent again"
    illegal = await post_form(client, f"/ui/jobs/{job['id']}/resume", page)
    assert illegal.status_code == 303, "resuming a queued job is a no-op, as in the API"


async def test_an_illegal_action_is_a_409_page(client, key, sign_in, submit):
    job = await submit()
    await client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    await sign_in(key)
    page = await client.get(f"/ui/jobs/{job['id']}")
    response = await post_form(client, f"/ui/jobs/{job['id']}/pause", page)
    assert response.status_code == 409
    assert "text/html" in response.headers["content-type"]


async def test_new_job_shows_each_error_at_its_field(client, key, sign_in):
    await sign_in(key)
    page = await client.get("/ui/new")
    assert "name: arith-opd" in page.text, "prefilled from examples/arith.yaml, the demo"
    assert "objective: jsd" in page.text
    text = "name: bad\nbackend: local\nloop:\n  steps: 0\n  stepz: 3\n"
    response = await post_form(client, "/ui/new", page, spec=text, idempotency_key=idem(page.text))
    assert response.status_code == 422
    body = response.text
    assert 'data-field="loop.steps"' in body and "greater than or equal to 1" in body
    assert 'data-field="loop.stepz"' in body and "(line 5)" in body
    assert "steps: 0" in body, "the text is kept for editing"


async def test_new_job_idempotency_key_makes_one_job_of_a_double_submit(
    client, key, sign_in, session
):
    await sign_in(key)
    page = await client.get("/ui/new")
    text = "name: twice\ndataset: {source: inline, prompts: [hi]}\n" + NAMED_YAML
    first = await post_form(client, "/ui/new", page, spec=text, idempotency_key=idem(page.text))
    again = await post_form(client, "/ui/new", page, spec=text, idempotency_key=idem(page.text))
    assert first.status_code == again.status_code == 303
    assert first.headers["location"] == again.headers["location"]
    count = await session.execute(
        select(func.count()).select_from(Job).where(Job.team_id == key.team.id, Job.name == "twice")
    )
    assert count.scalar_one() == 1
    changed = await post_form(
        client, "/ui/new", page, spec=text.replace("hi", "ho"), idempotency_key=idem(page.text)
    )
    assert changed.status_code == 409, "the same form key with another spec is refused"


async def test_a_form_field_holding_a_nul_is_a_400_and_stores_nothing(
    client, key, sign_in, session
):
    """Postgres's text columns cannot hold a NUL: a key with one was a 500 (the fuzzer)."""
    await sign_in(key)
    page = await client.get("/ui/new")
    text = "name: nul\ndataset: {source: inline, prompts: [hi]}\n" + NAMED_YAML
    response = await post_form(client, "/ui/new", page, spec=text, idempotency_key="k\x00")
    assert response.status_code == 400 and "NUL" in response.text
    count = await session.execute(
        select(func.count()).select_from(Job).where(Job.team_id == key.team.id, Job.name == "nul")
    )
    assert count.scalar_one() == 0


async def test_new_job_resubmitted_after_an_upgrade_is_the_same_job(client, key, sign_in):
    await sign_in(key)
    page = await client.get("/ui/new")
    text = "name: upgraded\ndataset: {source: inline, prompts: [hi]}\n" + NAMED_YAML
    first = await post_form(client, "/ui/new", page, spec=text, idempotency_key=idem(page.text))
    with upgraded_spec():
        again = await post_form(client, "/ui/new", page, spec=text, idempotency_key=idem(page.text))
    assert first.status_code == again.status_code == 303, again.text
    assert first.headers["location"] == again.headers["location"]


async def test_new_job_refuses_a_dataset_outside_the_data_root(client, key, sign_in):
    await sign_in(key)
    page = await client.get("/ui/new")
    text = "name: esc\ndataset: {source: file, path: ../../etc/passwd}\n" + NAMED_YAML
    response = await post_form(client, "/ui/new", page, spec=text, idempotency_key="k-esc")
    assert response.status_code == 422
    assert 'data-field="dataset.path"' in response.text


async def test_clone_prefills_the_form_with_the_jobs_spec(client, key, make_key, sign_in, submit):
    job = await submit(name="to-clone", loop={"steps": 7})
    other = await submit(as_key=await make_key(), name="not-yours")
    await sign_in(key)
    page = await client.get(f"/ui/new?from={job['id']}")
    assert "name: to-clone" in page.text and "steps: 7" in page.text
    assert (await client.get(f"/ui/new?from={other['id']}")).status_code == 404


async def test_compare_two_jobs_shows_the_differing_fields(client, key, make_key, sign_in, submit):
    first = await submit(name="cmp-a", loop={"steps": 5})
    second = await submit(name="cmp-b", loop={"steps": 9})
    await sign_in(key)
    page = (await client.get(f"/ui/compare?jobs={first['id']}&jobs={second['id']}")).text
    assert 'data-field="loop.steps"' in page and 'data-field="name"' in page
    assert 'data-field="backend"' not in page, "equal fields are left out"
    picker = await client.get(f"/ui/compare?jobs={first['id']}")
    assert picker.status_code == 200 and "Pick 2 to 8 jobs" in picker.text
    nine = "&".join(f"jobs={n}" for n in range(1, 10))
    assert (await client.get(f"/ui/compare?{nine}")).status_code in (400, 422)
    theirs = await submit(as_key=await make_key(), name="cmp-theirs")
    hidden = await client.get(f"/ui/compare?jobs={first['id']}&jobs={theirs['id']}")
    assert hidden.status_code == 404


async def test_the_dashboards_cookie_reads_the_json_api_but_never_writes(
    client, key, sign_in, submit
):
    job = await submit()
    await sign_in(key)
    read = await client.get(f"/v1/jobs/{job['id']}/metrics")
    assert read.status_code == 200, "the charts read curves with the session cookie"
    write = await client.post(f"/v1/jobs/{job['id']}/cancel")
    assert write.status_code == 401, "a cookie never authorises a change in the API"


async def test_the_openapi_document_has_no_dashboard_paths(client):
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert not [path for path in paths if path.startswith("/ui") or path == "/metrics"]


@pytest.mark.parametrize(
    "path",
    ["/ui/jobs/abc", "/ui/jobs/0", "/ui/jobs/1/explode", "/ui/nothing", "/ui/compare?jobs=x"],
)
async def test_bad_addresses_are_4xx_pages(client, key, sign_in, path):
    await sign_in(key)
    response = await client.get(path)
    assert 400 <= response.status_code < 500
    assert "text/html" in response.headers["content-type"]


def idem(page_text: str) -> str:
    match = re.search(r'name="idempotency_key" value="([^"]+)"', page_text)
    assert match
    return match.group(1)


async def test_small_spec_is_valid_for_the_form(client, key, sign_in):
    """The fixtures' spec passes the form's checks too (one rule set for both)."""
    import yaml

    await sign_in(key)
    page = await client.get("/ui/new")
    text = yaml.safe_dump(small_spec())
    response = await post_form(client, "/ui/new", page, spec=text, idempotency_key=idem(page.text))
    assert response.status_code == 303
