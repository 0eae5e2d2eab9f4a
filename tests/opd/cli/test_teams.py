"""`opd keys create --scope/--expires` and `opd teams` as an operator runs them: real
processes on a SQLite file, then the API on it."""

from __future__ import annotations

import sqlite3
from contextlib import closing

from app.core.config import Settings
from tests.app.conftest import serve, small_spec
from tests.opd.cli.test_keys import opd_keys, run_opd


async def test_a_read_key_with_an_expiry_reads_but_cannot_submit(tmp_path):
    created = opd_keys(
        "create", "--team", "alpha", "--scope", "read", "--expires", "90d", home=tmp_path
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert "scope read, expires" in created.stderr

    listed = opd_keys("list", home=tmp_path).stdout
    assert "team=alpha  scope=read  active (until" in listed
    with closing(sqlite3.connect(tmp_path / "keys.db")) as db:
        audit = db.execute("SELECT action, key_prefix, target FROM audit_log").fetchall()
    assert audit == [("key.create", None, f"key {key.split('_')[1]}")]

    settings = Settings(
        home=tmp_path, database_url=f"sqlite:///{tmp_path / 'keys.db'}", migrate_on_start=False
    )
    headers = {"Authorization": f"Bearer {key}"}
    async with serve(settings) as client:
        assert (await client.get("/v1/jobs", headers=headers)).status_code == 200
        refused = await client.post("/v1/jobs", json=small_spec(), headers=headers)
    assert refused.status_code == 403
    assert "'submit' scope" in refused.json()["error"]["message"]


def test_teams_limits_are_set_listed_and_reset(tmp_path):
    assert opd_keys("create", "--team", "beta", home=tmp_path).returncode == 0

    set_both = run_opd(
        "teams", "set", "beta", "--max-running", "2", "--max-queued", "10", home=tmp_path
    )
    reset = run_opd("teams", "set", "beta", "--max-queued", "default", home=tmp_path)
    listed = run_opd("teams", "list", home=tmp_path)
    unknown = run_opd("teams", "set", "nobody", "--max-running", "1", home=tmp_path)
    bad = run_opd("teams", "set", "beta", "--max-running", "0", home=tmp_path)

    assert set_both.returncode == 0, set_both.stderr
    assert "beta" in set_both.stdout and "2 " in set_both.stdout and "10" in set_both.stdout
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("beta")]
    assert row.split()[1:] == ["0", "0", "2", "none", "(default)"]
    assert "none (default)" in reset.stdout
    assert unknown.returncode == 1 and "no team named 'nobody'" in unknown.stderr
    assert bad.returncode == 2 and "give a number of jobs" in bad.stderr


def test_without_its_audit_row_an_operators_change_is_undone(tmp_path):
    made = opd_keys("create", "--team", "alpha", home=tmp_path)
    prefix = made.stdout.split("_")[1]
    with closing(sqlite3.connect(tmp_path / "keys.db")) as db, db:
        db.execute(
            "CREATE TRIGGER audit_down BEFORE INSERT ON audit_log "
            "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )

    refused = [
        opd_keys("create", "--team", "beta", home=tmp_path),
        opd_keys("revoke", prefix, home=tmp_path),
        run_opd("teams", "set", "alpha", "--max-running", "2", home=tmp_path),
    ]

    assert [run.returncode != 0 for run in refused] == [True] * 3
    with closing(sqlite3.connect(tmp_path / "keys.db")) as db:
        teams = db.execute("SELECT name, max_running FROM teams").fetchall()
        keys = db.execute("SELECT prefix, revoked_at FROM api_keys").fetchall()
    assert (teams, keys) == ([("alpha", None)], [(prefix, None)])


async def test_a_budget_raised_in_the_database_says_its_paused_jobs_resume(tmp_path):
    """Without a Redis of its own the command cannot send what it resumed: it says the
    workers' requeuer will (it used to say the jobs 'stay queued: no Redis is configured'
    while they had resumed); and a cost budget refused for want of prices here says that
    the service's own are used over HTTP."""
    key = opd_keys("create", "--team", "alpha", home=tmp_path).stdout.strip()
    settings = Settings(
        home=tmp_path, database_url=f"sqlite:///{tmp_path / 'keys.db'}", migrate_on_start=False
    )
    async with serve(settings) as client:
        job = await client.post(
            "/v1/jobs", json=small_spec(), headers={"Authorization": f"Bearer {key}"}
        )
    job_id = job.json()["id"]
    with closing(sqlite3.connect(tmp_path / "keys.db")) as db, db:
        db.execute(
            "UPDATE jobs SET status = 'paused', stop_reason = 'budget' WHERE id = ?", (job_id,)
        )

    raised = run_opd("teams", "budget", "alpha", "--tokens", "100000", home=tmp_path)
    in_cost = run_opd("teams", "budget", "alpha", "--cost", "0.05", home=tmp_path)

    assert raised.returncode == 0, raised.stderr
    assert "team alpha: 0 tokens of 100,000 tokens this month" in raised.stdout
    assert f"Resumed jobs [{job_id}]: queued" in raised.stderr
    assert "stay queued" not in raised.stderr
    with closing(sqlite3.connect(tmp_path / "keys.db")) as db:
        assert db.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone() == (
            "queued",
        )
    assert in_cost.returncode == 1
    assert "this shell has no OPD_PRICES; the service's own are used over HTTP" in in_cost.stderr
