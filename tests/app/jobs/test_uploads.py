"""An eval that asks an uploaded file for more held-out rows than it has is a 422 at
submission, where the file's rows are known (it used to be accepted, then fail in the
worker with `bad_eval`)."""

from __future__ import annotations

import json
import uuid

from tests.app.conftest import auth, small_spec


async def uploaded(client, key, rows: int) -> str:
    lines = [
        {"question": f"What is {i} + 1? {uuid.uuid4().hex}", "answer": str(i + 1)}
        for i in range(rows)
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    answer = await client.post(
        "/v1/files", params={"filename": "sums.jsonl"}, content=body, headers=auth(key)
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


async def test_a_holdout_past_the_files_rows_is_refused_at_submission(client, key) -> None:
    file_id = await uploaded(client, key, rows=60)
    every_row = small_spec(dataset={"source": "file", "file": file_id}, eval={"holdout": 20})
    answer = await client.post("/v1/jobs", json=every_row, headers=auth(key))
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["param"] == "eval.holdout"
    assert "0 rows outside the training pool" in error["message"]
    assert "sample_size to at most 40" in error["message"]

    fits = small_spec(
        dataset={"source": "file", "file": file_id, "sample_size": 40}, eval={"holdout": 20}
    )
    assert (await client.post("/v1/jobs", json=fits, headers=auth(key))).status_code == 201
    over = small_spec(
        dataset={"source": "file", "file": file_id, "sample_size": 41}, eval={"holdout": 20}
    )
    refused = await client.post("/v1/jobs", json=over, headers=auth(key))
    assert refused.status_code == 422 and "19 rows outside" in refused.json()["error"]["message"]
