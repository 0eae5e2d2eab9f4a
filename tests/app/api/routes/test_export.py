"""Exporting every step of a job's metrics as CSV or JSON Lines, streamed."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from app.api.routes import export
from app.jobs.store import claim_job
from app.records.store import record_step
from tests.app.conftest import auth

WORKER = "worker-1"


def step_metrics(step: int) -> dict[str, float]:
    metrics = {"opd/reverse_kl_mean": 1 / (step + 1), "data/datums": 4.0}
    if step % 3 == 0:
        metrics["eval/accuracy"] = math.nan if step == 3 else step / 100
    return metrics


@pytest.fixture
async def job_id(submit, session) -> int:
    job = await submit(loop={"steps": 11})
    await claim_job(session, job["id"], WORKER, heartbeat_timeout=60)
    for step in range(11):
        await record_step(session, job["id"], WORKER, step, step_metrics(step))
    return job["id"]


@pytest.fixture(autouse=True)
def small_pages(monkeypatch):
    monkeypatch.setattr(export, "PAGE", 4)  # several pages for 11 steps


async def test_csv_has_a_column_per_metric_and_a_row_per_step(client, key, job_id):
    response = await client.get(f"/v1/jobs/{job_id}/metrics/export", headers=auth(key))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert f'filename="job-{job_id}-metrics.csv"' in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert list(rows[0]) == ["step", "data/datums", "eval/accuracy", "opd/reverse_kl_mean"]
    assert [int(row["step"]) for row in rows] == list(range(11))
    for row in rows:
        expected = step_metrics(int(row["step"]))
        assert float(row["opd/reverse_kl_mean"]) == expected["opd/reverse_kl_mean"], "exact"
        accuracy = expected.get("eval/accuracy")
        cell = "" if accuracy is None or math.isnan(accuracy) else repr(accuracy)
        assert row["eval/accuracy"] == cell


async def test_jsonl_lines_match_opd_run_metrics_out(client, key, job_id):
    response = await client.get(
        f"/v1/jobs/{job_id}/metrics/export", params={"format": "jsonl"}, headers=auth(key)
    )
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line["step"] for line in lines] == list(range(11))
    assert lines[3] == {"step": 3, **step_metrics(3), "eval/accuracy": None}
    assert lines[4] == {"step": 4, **step_metrics(4)}


async def test_chosen_metrics_and_steps(client, key, job_id):
    params = {"keys": "eval/accuracy", "from_step": 2, "to_step": 9}
    url = f"/v1/jobs/{job_id}/metrics/export"
    text = (await client.get(url, params=params, headers=auth(key))).text
    assert text == "step,eval/accuracy\n3,\n6,0.06\n9,0.09\n", "steps without it are left out"
    lines = (await client.get(url, params=params | {"format": "jsonl"}, headers=auth(key))).text
    assert [json.loads(line)["step"] for line in lines.splitlines()] == [3, 6, 9]


async def test_a_metric_the_job_never_recorded_is_refused_with_the_names_it_did(
    client, key, job_id, submit
):
    url = f"/v1/jobs/{job_id}/metrics/export"
    bogus = await client.get(url, params={"keys": "bogus_metric"}, headers=auth(key))
    assert bogus.status_code == 422, bogus.text
    error = bogus.json()["error"]
    assert (error["code"], error["param"]) == ("unknown_metric", "keys")
    assert error["message"].endswith("Its metrics: data/datums, eval/accuracy, opd/reverse_kl_mean")
    assert "(yet)" in error["message"], "the job is still running"
    short = await client.get(url, params={"keys": "reverse_kl"}, headers=auth(key))
    assert "did you mean `opd/reverse_kl_mean`?" in short.json()["error"]["message"]
    fresh = await submit()
    none = await client.get(
        f"/v1/jobs/{fresh['id']}/metrics/export", params={"keys": "x"}, headers=auth(key)
    )
    assert "has recorded no metrics yet" in none.json()["error"]["message"]


async def test_a_job_without_steps_exports_a_header(client, key, submit):
    job = await submit()
    response = await client.get(f"/v1/jobs/{job['id']}/metrics/export", headers=auth(key))
    assert response.status_code == 200 and response.text == "step\n"


async def test_another_teams_job_and_bad_parameters(client, key, make_key, job_id):
    other = await make_key()
    url = f"/v1/jobs/{job_id}/metrics/export"
    assert (await client.get(url, headers=auth(other))).status_code == 404
    cases = [
        ({"format": "xlsx"}, "format"),
        ({"keys": ","}, "keys"),
    ]
    for params, param in cases:
        response = await client.get(url, params=params, headers=auth(key))
        assert response.status_code == 422, params
        assert response.json()["error"]["param"] == param
    inverted = await client.get(url, params={"from_step": 5, "to_step": 1}, headers=auth(key))
    assert inverted.status_code == 200 and inverted.text.count("\n") == 1  # the header only
