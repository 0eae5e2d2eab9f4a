"""GET /v1/usage and the job body's usage: a team's tokens by job or day, an admin's for any
team or all, and an estimated cost only where the price table has the prices."""

from __future__ import annotations

import pytest

from app.core.config import Settings
from app.core.pricing import Price
from app.core.tables import utcnow
from app.jobs.rows import get_job
from app.jobs.store import claim_job
from app.records.store import record_step
from tests.app.conftest import auth, serve

PRICES = [
    Price(backend="local", model="Qwen/Qwen3.5-4B", sampled=2.0, trained=4.0),
    Price(backend="local", model="Qwen/Qwen3.6-27B", scored=1.0),
]


async def used(sessions, job_id: int, sampled: int, scored: int, trained: int) -> None:
    async with sessions() as session:
        await claim_job(session, job_id, "w", heartbeat_timeout=60)
        metrics = {
            "usage/sampled_tokens": sampled,
            "usage/teacher_tokens": scored,
            "usage/trained_tokens": trained,
        }
        await record_step(session, job_id, "w", 0, metrics)


@pytest.fixture
async def priced_client(settings: Settings):
    async with serve(settings.model_copy(update={"prices": PRICES})) as http:
        yield http


async def test_a_teams_usage_by_job_and_by_day_with_costs(priced_client, sessions, key, submit):
    first, second = await submit(), await submit()
    await used(sessions, first["id"], 1_000_000, 2_000_000, 500_000)
    await used(sessions, second["id"], 10, 20, 30)

    by_job = (await priced_client.get("/v1/usage", headers=auth(key))).json()
    by_day = await priced_client.get("/v1/usage?group_by=day", headers=auth(key))
    job = (await priced_client.get(f"/v1/jobs/{first['id']}", headers=auth(key))).json()

    assert by_job["team"] == key.team.name and by_job["priced"] is True
    rows = {row["job_id"]: row for row in by_job["rows"]}
    assert rows[first["id"]]["sampled_tokens"] == 1_000_000
    assert rows[first["id"]]["estimated_cost"] == pytest.approx(2 + 2 + 2)
    assert by_job["total"]["trained_tokens"] == 500_030
    (today,) = by_day.json()["rows"]
    assert today["day"] == str(utcnow().date()) and today["teacher_tokens"] == 2_000_020
    assert job["usage"] == {
        "sampled_tokens": 1_000_000,
        "teacher_tokens": 2_000_000,
        "trained_tokens": 500_000,
        "eval_tokens": 0,
        "estimated_cost": pytest.approx(6.0),
    }


async def test_without_a_price_table_no_cost_is_shown(client, sessions, key, submit):
    job = await submit()
    await used(sessions, job["id"], 5, 6, 7)
    report = (await client.get("/v1/usage", headers=auth(key))).json()
    assert report["priced"] is False
    assert report["rows"][0]["estimated_cost"] is None
    assert report["total"]["estimated_cost"] is None
    body = (await client.get(f"/v1/jobs/{job['id']}", headers=auth(key))).json()
    assert body["usage"]["estimated_cost"] is None and body["usage"]["sampled_tokens"] == 5


async def test_an_admin_sees_any_team_or_all_and_others_see_their_own(
    client, sessions, make_key, submit
):
    alpha, beta, admin = await make_key(), await make_key(), await make_key(admin=True)
    await used(sessions, (await submit(alpha))["id"], 1, 1, 1)
    await used(sessions, (await submit(beta))["id"], 2, 2, 2)

    every = (await client.get("/v1/usage", headers=auth(admin))).json()
    one = (await client.get(f"/v1/usage?team={beta.team.name}", headers=auth(admin))).json()
    refused = await client.get(f"/v1/usage?team={beta.team.name}", headers=auth(alpha))

    teams = {row["team"] for row in every["rows"]}
    assert {alpha.team.name, beta.team.name} <= teams and every["team"] is None
    assert {row["team"] for row in one["rows"]} == {beta.team.name}
    assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
    unknown = await client.get("/v1/usage?team=no-such-team", headers=auth(admin))
    assert unknown.status_code == 404


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("since=yesterday", "since"),
        ("since=0", "since"),  # not seconds since 1970
        ("until=1700000000", "until"),
        ("from=0", "from"),  # the old name, checked alike
        ("group_by=week", "group_by"),
    ],
)
async def test_a_bad_range_is_a_422_naming_it(client, key, query, param):
    response = await client.get(f"/v1/usage?{query}", headers=auth(key))
    assert response.status_code == 422
    assert response.json()["error"]["param"] == param


async def test_a_range_ending_before_it_starts_has_no_days(client, sessions, key, submit):
    job = await submit()
    await used(sessions, job["id"], 3, 3, 3)
    today = utcnow().date().isoformat()
    empty = await client.get(f"/v1/usage?since={today}&until=2000-01-01", headers=auth(key))
    assert empty.status_code == 200 and empty.json()["rows"] == []
    oldest = await client.get("/v1/usage?until=0001-01-02", headers=auth(key))
    assert oldest.status_code == 200 and oldest.json()["since"] == "0001-01-01"


async def test_old_days_are_outside_a_recent_range(client, sessions, key, submit):
    job = await submit()
    await used(sessions, job["id"], 3, 3, 3)
    async with sessions() as session:
        assert (await get_job(session, job["id"])).sampled_tokens == 3
    old = (
        await client.get("/v1/usage?since=2020-01-01&until=2020-01-31", headers=auth(key))
    ).json()
    assert old["rows"] == [] and old["total"]["sampled_tokens"] == 0


async def test_the_old_filter_names_from_and_to_still_work_for_one_release(client, key):
    new = await client.get("/v1/usage?since=2020-01-01&until=2020-01-31", headers=auth(key))
    old = await client.get("/v1/usage?from=2020-01-01&to=2020-01-31", headers=auth(key))
    both = await client.get("/v1/usage?since=2020-01-01&from=2019-01-02", headers=auth(key))
    assert old.status_code == 200 and old.json() == new.json()
    assert (new.json()["since"], new.json()["until"]) == ("2020-01-01", "2020-01-31")
    assert (new.json()["from"], new.json()["to"]) == ("2020-01-01", "2020-01-31")
    assert both.status_code == 200 and both.json()["since"] == "2020-01-01"  # the new name wins
