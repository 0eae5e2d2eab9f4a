"""The sweep pages over HTTP: the form from a job is prefilled and shows what is wrong
without storing anything; a read key sees the page but not the form's action; the list and
the page are the team's own; the header names the team; a trial's latest judgment shows."""

from __future__ import annotations

import html
import re

import yaml

from app.auth.schemas import Scope
from app.core.tables import utcnow
from app.jobs.store import create_job
from app.sweeps.schemas import SweepCreate
from app.sweeps.store import create_sweep
from app.sweeps.tables import SweepRung
from kernel.spec import JobSpec
from tests.app.conftest import auth, small_spec
from tests.app.web.conftest import post_form

TEXTAREA = re.compile(r'<textarea name="definition"[^>]*>(.*?)</textarea>', re.S)


async def test_a_sweep_from_a_job_is_checked_then_created(client, key, sign_in, submit):
    job = await submit()
    await sign_in(key)
    assert f"team {key.team.name}" in (await client.get("/ui/jobs")).text
    form = await client.get(f"/ui/sweeps/new?base_job={job['id']}")
    definition = yaml.safe_load(html.unescape(TEXTAREA.search(form.text).group(1)))
    assert definition["base_job"] == job["id"]

    bad = yaml.safe_dump(definition | {"parameters": {"student.lora_rank": {"values": [2]}}})
    refused = await post_form(client, "/ui/sweeps/new", form, definition=bad)
    assert refused.status_code == 422
    assert "parameters.student.lora_rank" in refused.text
    path = {"teacher.init_from.path": {"values": ["/elsewhere/final"]}}
    named = await post_form(
        client, "/ui/sweeps/new", form, definition=yaml.safe_dump(definition | {"parameters": path})
    )
    assert named.status_code == 422
    assert "parameters.teacher.init_from.path: only init_from.job" in html.unescape(named.text)
    broken = await post_form(client, "/ui/sweeps/new", form, definition="name: [")
    assert broken.status_code == 422 and "not valid YAML" in broken.text
    assert (await client.get("/v1/sweeps", headers=auth(key))).json()["data"] == []

    created = await post_form(client, "/ui/sweeps/new", form, definition=yaml.safe_dump(definition))
    assert created.status_code == 303
    page = await client.get(created.headers["location"])
    assert page.status_code == 200
    assert "No trial has started yet" in page.text
    assert "/cancel" in page.text
    listed = await client.get("/ui/sweeps")
    assert definition["name"] in listed.text


async def test_a_read_key_sees_the_page_but_cannot_cancel(client, key, make_key, sign_in):
    sweep = (
        await client.post(
            "/v1/sweeps",
            json={
                "name": "looked-at",
                "base": small_spec(),
                "parameters": {"optim.learning_rate": {"values": [1e-3]}},
                "method": "grid",
                "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
            },
            headers=auth(key),
        )
    ).json()
    reader = await make_key(key.team.name, scope=Scope.read)
    await sign_in(reader)
    page = await client.get(f"/ui/sweeps/{sweep['id']}")
    assert page.status_code == 200 and "looked-at" in page.text
    assert f"/ui/sweeps/{sweep['id']}/cancel" not in page.text
    refused = await post_form(client, f"/ui/sweeps/{sweep['id']}/cancel", page)
    assert refused.status_code == 403

    stranger = await make_key()
    await sign_in(stranger)
    assert (await client.get(f"/ui/sweeps/{sweep['id']}")).status_code == 404
    assert "looked-at" not in (await client.get("/ui/sweeps")).text


async def test_the_sweep_form_reads_yaml_with_the_apis_limits(client, key, sign_in, submit):
    """An alias can stand for a huge tree: 58 KB of them became a 100 MB definition that
    every GET /v1/sweeps then answered. Aliases, an overlong text and non-finite numbers
    are refused; nothing is stored."""
    job = await submit()
    await sign_in(key)
    form = await client.get(f"/ui/sweeps/new?base_job={job['id']}")
    definition = yaml.safe_load(html.unescape(TEXTAREA.search(form.text).group(1)))
    aliased = yaml.safe_dump(definition | {"parameters": {}}).replace(
        "parameters: {}",
        "parameters:\n  metadata.a: {values: &v [x, y]}\n  metadata.b: {values: *v}",
    )
    assert yaml.safe_load(aliased)["parameters"]["metadata.b"] == {"values": ["x", "y"]}
    infinite = definition | {"parameters": {"optim.grad_clip_norm": {"values": [float("inf")]}}}
    for text, says in (
        (aliased, "YAML anchors and aliases (&amp;name, *name) are not accepted"),
        ("#" * 200_001, "a sweep has at most 200,000 characters"),
        (yaml.safe_dump(infinite), "should be a finite number"),
    ):
        refused = await post_form(client, "/ui/sweeps/new", form, definition=text)
        assert refused.status_code == 422 and says in refused.text, refused.text[-2000:]
    assert (await client.get("/v1/sweeps", headers=auth(key))).json()["data"] == []


async def test_the_page_shows_each_trials_latest_judgment(client, key, sign_in, session):
    definition = SweepCreate.model_validate(
        {
            "name": "judged",
            "base": small_spec(loop={"steps": 30}),
            "parameters": {"optim.learning_rate": {"values": [1e-3, 2e-3]}},
            "method": "grid",
            "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
            "early_stop": {"type": "asha", "min_steps": 10, "eta": 3},
        }
    )
    sweep, _ = await create_sweep(session, key.team.id, definition)
    spec = JobSpec.model_validate(small_spec(loop={"steps": 30}))
    trial = (await create_job(session, key.team.id, spec, trial=(sweep.id, 1))).job
    for rung, kept in ((10, True), (30, False)):
        session.add(
            SweepRung(
                job_id=trial.id,
                rung=rung,
                sweep_id=sweep.id,
                value=0.5,
                kept=kept,
                competing=3,
                decided_at=utcnow(),
            )
        )
    await session.commit()
    await sign_in(key)
    page = await client.get(f"/ui/sweeps/{sweep.id}")
    assert "step 30: lost (3 there)" in page.text and "step 10: kept" not in page.text
