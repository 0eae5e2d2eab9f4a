"""lm-evaluation-harness (`lm_eval`, its `local-completions` model, a client nobody here
wrote) runs a loglikelihood task defined in the repository (tests/e2e/lm_eval: a task YAML
and its JSONL data, no hub) against `POST /v1/completions` for a finished tiny job's
model, served by real `opd api` and `opd worker` processes, four prompts a request. Each
request's loglikelihood is the sum of the playground's prompt logprobs over the
continuation of the same text, and its is_greedy says whether each continuation token is
the playground's top-1 there (some are, some are not)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import ROOT, Service, deployment, tiny_spec
from tests.support import assert_close
from worker.engine.backends.local.presets import tiny_tokenizer

TASKS = ROOT / "tests" / "e2e" / "lm_eval"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("lm-eval")
    with deployment(home, f"sqlite:///{home / 'opd.db'}") as running:
        running.start_worker()
        yield running


@pytest.fixture(scope="module")
def finished(service: Service) -> dict[str, Any]:
    job = service.submit(tiny_spec(steps=4, save_every=2) | {"name": "evaluated"})
    done = service.wait(job["id"])
    assert done["status"] == "succeeded", done
    return done


def lm_eval(service: Service, model: str, tokenizer: Path, output: Path) -> str:
    """`lm_eval` run as a person runs it (from the repository's root, which the task's
    data file is named from); its stdout, which ends with the results table."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "--model",
            "local-completions",
            "--model_args",
            f"model={model},base_url={service.url}/v1/completions,"
            f"tokenizer={tokenizer},tokenizer_backend=huggingface",
            "--batch_size",
            "4",
            "--tasks",
            "opd_tiny",
            "--include_path",
            str(TASKS),
            "--output_path",
            str(output),
            "--log_samples",
        ],
        cwd=ROOT,
        env=service.env
        | {"OPENAI_API_KEY": service.key, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:] + service.logs()
    return done.stdout


def playground(service: Service, job_id: int, text: str, top_logprobs: int) -> dict[str, Any]:
    """The checkpoint's prompt logprobs of `text` (and its top tokens), as the playground
    scores a text."""
    response = httpx.post(
        f"{service.url}/v1/jobs/{job_id}/sample",
        json={
            "text": text,
            "max_tokens": 0,
            "prompt_logprobs": True,
            "top_logprobs": top_logprobs,
        },
        headers={"Authorization": f"Bearer {service.key}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_lm_evals_loglikelihoods_are_the_playgrounds_and_is_greedy_its_top_1(
    service, finished, tmp_path
):
    job = finished["id"]
    tokenizer = tiny_tokenizer()  # the job's student's (tiny-student)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    table = lm_eval(service, f"job-{job}", tmp_path / "tokenizer", tmp_path / "out")
    print(table)  # the harness's results table, for a person reading the test's output

    (samples,) = (tmp_path / "out").glob("*/samples_opd_tiny_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    data = (TASKS / "opd_tiny.jsonl").read_text().splitlines()
    assert len(rows) == len(data) == 8
    got, expected, greedy, top_1 = [], [], [], []
    for row in sorted(rows, key=lambda row: row["doc_id"]):
        context, continuation = row["arguments"]["gen_args_0"].values()
        ((loglikelihood, is_greedy),) = row["resps"][0]
        ids = tokenizer.encode(context + continuation, add_special_tokens=False)
        start = len(tokenizer.encode(context, add_special_tokens=False))
        scored, ranked = (playground(service, job, context + continuation, k) for k in (0, 1))
        assert scored["prompt_token_ids"] == ranked["prompt_token_ids"] == ids
        (output,) = scored["outputs"]
        got.append(float(loglikelihood))
        expected.append(sum(output["prompt_logprobs"][start:]))
        greedy.append(is_greedy == "True")
        tops = ranked["outputs"][0]["prompt_top_logprobs"][start:]
        top_1.append(
            all(top[0]["token_id"] == token for top, token in zip(tops, ids[start:], strict=True))
        )
    assert_close(got, expected, rtol=1e-5, what="lm_eval's loglikelihoods")
    assert greedy == top_1, "is_greedy is whether each continuation token is the top-1"
    assert True in greedy and False in greedy, "the data holds greedy continuations and others"

    (results,) = (tmp_path / "out").glob("*/results_*.json")
    metrics = json.loads(results.read_text())["results"]["opd_tiny"]
    assert metrics["acc,none"] == pytest.approx(sum(greedy) / len(greedy))
    assert "|opd_tiny|" in table and "acc" in table
