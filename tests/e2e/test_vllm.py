"""vLLM where users run it, on a real vLLM server (`opd vllm serve`, the CPU build; one for
this module) over smollm2-135m-instruct, beside a real service whose worker trains a short
job on the same model:

- serving what a job trained: the job's final adapter, exported as it is (`opd export`),
  loads into vLLM (`/v1/load_lora_adapter`) and vLLM's `echo` logprobs equal this service's
  `/v1/completions` of the same checkpoint (within 1e-3, in float32);
- teachers on vLLM: the server teacher scores on vLLM, with both protocols (`echo`, and
  `prompt_logprobs` with its top k), as the same teacher loaded in the worker does.

The vLLM environment is built if missing (`opd vllm setup`: 3-5 minutes with torch in pip's
cache, once per machine; scripts/test.sh runs it first)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from kernel.model_names import SMOLLM2
from opd.cli import main
from opd.serve import free_port
from opd.vllm_server import ensure_environment, environment, wait_ready
from tests.e2e.conftest import ROOT, Service
from tests.e2e.test_real_model import SPEC as REAL_MODEL_SPEC
from tests.e2e.test_real_model import model_cache, service

__all__ = ["model_cache", "service"]  # the fixtures of the real-model test, for this module

pytestmark = pytest.mark.timeout(1200)  # a 135M model, twice, on a loaded 2-core machine

SERVED_TOLERANCE = 1e-3
"""vLLM's logprobs of a job's adapter against this service's, float32 both (issue 39)."""
TEACHER_TOLERANCE = 5e-4
"""The server teacher on vLLM against the same teacher in the worker, float32 both: each
token's logprob and its top k (measured: at most 4.4e-5 with echo, 6.3e-5 with
prompt_logprobs)."""
QUESTION = "7 + 8 = ?"
ANSWER = "7 + 8 = 15. The answer is 15."
SPEC = REAL_MODEL_SPEC | {
    "name": "smollm2-vllm",
    "optim": {"learning_rate": 1e-3},  # two steps that move the adapter well past rounding
    "loop": {"steps": 2, "batch_size": 1, "group_size": 2},
}


@pytest.fixture(scope="module")
def launched(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`opd vllm serve` on the preset, started early (it loads while the job trains)."""
    ensure_environment(environment(), lambda line: print(line, file=sys.stderr))
    port = free_port()
    log = (tmp_path_factory.mktemp("vllm") / "vllm.log").open("wb")
    # --max-lora-rank: the largest rank trained here (the CPU's LoRA kernels pay for padding)
    serve = ["vllm", "serve", SMOLLM2, "--port", str(port), "--max-lora-rank", "8"]
    process = subprocess.Popen(
        [sys.executable, "-m", "opd.cli", *serve],
        env=os.environ | {"OPD_MODEL_CACHE": str(model_cache), "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    yield process, f"http://127.0.0.1:{port}", Path(log.name)
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
    log.close()


@pytest.fixture(scope="module")
def vllm(launched: Any) -> str:
    """The base URL of the ready server, which the command announced."""
    process, url, log = launched
    wait_ready(url, process, timeout=900)
    for _ in range(50):  # the command prints its lines just after the server answers
        if "OPD_VLLM_SERVERS" in log.read_text(errors="replace"):
            break
        time.sleep(0.1)
    assert f'export OPD_VLLM_SERVERS=\'{{"{SMOLLM2}": "{url}/v1"}}\'' in log.read_text()
    assert f"export OPD_VLLM_MAX_LORA_RANKS='{{\"{SMOLLM2}\": 8}}'" in log.read_text()
    return url


@pytest.fixture(scope="module")
def trained(launched: Any, service: Service) -> dict[str, Any]:
    job = service.submit(SPEC)
    done = service.wait(job["id"], timeout=900)
    assert done["status"] == "succeeded", (done, service.logs())
    return done


@pytest.fixture(scope="module")
def ids(model_cache: Path) -> list[int]:
    """A question and its answer as SmolLM2's chat template renders them."""
    from transformers import AutoTokenizer

    (folder,) = model_cache.glob("gguf-*")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    chat = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}]
    return list(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False))


def echo_logprobs(url: str, model: str, ids: list[int], key: str | None = None) -> np.ndarray:
    """Each token's logprob after the first, as `/v1/completions` with `echo` scores it."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0}
    answer = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=300)
    assert answer.status_code == 200, answer.text
    values = answer.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert values[0] is None and len(values) == len(ids)
    return np.asarray(values[1:], dtype=np.float64)


def test_a_jobs_adapter_loads_into_vllm_and_scores_as_the_service_does(
    trained, vllm, service, ids, tmp_path, capsys
):
    job = trained["id"]
    adapter = tmp_path / "adapter"
    assert main(["export", str(job), str(adapter), "--url", service.url, "--key", service.key]) == 0
    capsys.readouterr()
    loaded = httpx.post(
        f"{vllm}/v1/load_lora_adapter",
        json={"lora_name": f"job-{job}", "lora_path": str(adapter)},
        timeout=300,
    )
    assert loaded.status_code == 200, loaded.text

    ours = echo_logprobs(service.url, f"job-{job}", ids, service.key)
    theirs = echo_logprobs(vllm, f"job-{job}", ids)
    base = echo_logprobs(vllm, SMOLLM2, ids)

    difference = float(np.abs(theirs - ours).max())
    print(f"vLLM vs the service, job {job}'s adapter: max |diff| {difference:.2e}")
    assert difference <= SERVED_TOLERANCE
    assert float(np.abs(base - ours).max()) > 10 * SERVED_TOLERANCE, "the adapter was applied"


TOP_K = 5


@pytest.fixture(scope="module")
def worker_teacher(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The teacher as a worker loads it: the local backend's frozen SmolLM2, float32."""
    from kernel.spec import LocalBackendSpec
    from worker.engine.backends.local import LocalServiceClient

    service = LocalServiceClient(
        LocalBackendSpec(device="cpu"), tmp_path_factory.mktemp("teacher"), model_cache
    )
    return asyncio.run(service.create_sampling_client_async(SMOLLM2))


async def on_server(
    vllm: str, protocol: str, prompts: list[list[int]], k: int, model_cache: Path
) -> list[Any]:
    """The server teacher's scores of `prompts`, asked at once, after the preflight's check
    that the server's token texts are the student's. One prompt a request, one request at
    a time: vLLM's CPU engine dies on a step holding two prompts' prompt logprobs."""
    from kernel.spec import TeacherServer
    from worker.engine.backends.local.models import ModelCache, load_tokenizer
    from worker.engine.backends.server import ServerTeacher

    teacher = ServerTeacher(
        TeacherServer(
            url=f"{vllm}/v1", model=SMOLLM2, protocol=protocol, batch_size=1, max_concurrency=1
        ),
        load_tokenizer(SMOLLM2, ModelCache(model_cache)),
    )
    try:
        assert await teacher.probe(prompts[0]) is None, "vLLM's token texts are SmolLM2's"
        return list(await asyncio.gather(*(teacher.score(p, k) for p in prompts)))
    finally:
        await teacher.aclose()


@pytest.mark.parametrize("protocol", ["echo", "prompt_logprobs"])
def test_the_server_teacher_on_vllm_scores_as_the_worker_loaded_teacher(
    vllm, worker_teacher, ids, protocol, model_cache
):
    from pytrio.types import ModelInput, SamplingParams

    prompts = [ids, ids[: len(ids) // 2]]
    k = TOP_K if protocol == "prompt_logprobs" else 0
    served = asyncio.run(on_server(vllm, protocol, prompts, k, model_cache))

    worst = 0.0
    for prompt, scored in zip(prompts, served, strict=True):
        local = asyncio.run(
            worker_teacher.sample_async(
                ModelInput.from_ints(prompt),
                sampling_params=SamplingParams(max_tokens=1),
                include_prompt_logprobs=True,
                topk_prompt_logprobs=k,
            )
        )
        assert scored.logprobs[0] is None and len(scored.logprobs) == len(prompt)
        theirs = np.asarray(scored.logprobs[1:], dtype=np.float64)
        ours = np.asarray(local.prompt_logprobs[1:], dtype=np.float64)
        worst = max(worst, float(np.abs(theirs - ours).max()))
        if k:  # the k likeliest at each position: the same tokens, the same values
            for served_row, local_row in zip(
                scored.topk[1:], local.topk_prompt_logprobs[1:], strict=True
            ):
                mine = dict(local_row)
                shared = [(t, v) for t, v in served_row if t in mine]
                assert len(shared) >= k - 1, (served_row, local_row)  # a tie at the k-th
                worst = max(worst, max(abs(v - mine[t]) for t, v in shared))
    print(f"server teacher on vLLM ({protocol}) vs the worker's: max |diff| {worst:.2e}")
    assert worst <= TEACHER_TOLERANCE


SAMPLER_TOLERANCE = 1e-3
"""How far vLLM's logprobs of the rollouts it sampled may be from the trainer's."""


RESUMED_SPEC = SPEC | {
    "name": "smollm2-vllm-resume",
    # A teacher unlike the student from step 0: were it the student itself, step 0's
    # advantages would be rounding noise, which Adam scales to a full step.
    "teacher": {"self": {"system": "Answer with the number only, no words."}},
    "dataset": {"source": "arithmetic", "question_suffix": "", "count": 20, "seed": 1},
    "sampling": {"max_tokens": 8, "engine": "vllm"},
    "loop": {"steps": 4, "batch_size": 1, "group_size": 2, "save_every": 2},
    "eval": {"every": 3, "holdout": 4, "grader": {"regex": "-?[0-9]+"}},
}
COMPARED = ("opd/reverse_kl_mean", "trainer/loss_sum")
RESUME_TOLERANCE = 1e-3
"""Relative: vLLM's CPU build gives the same tokens' logprobs a few 1e-8 apart from one run
to the next (measured: two uninterrupted runs of 4 steps end 2e-6 apart in reverse KL), so
a run on vLLM repeats another one closely, not bit for bit."""


def test_a_job_on_vllm_killed_9_resumes_from_its_state_with_its_evals_on_vllm(
    vllm, model_cache, tmp_path
):
    """An uninterrupted `opd run` on vLLM samples each step's rollouts with that step's
    adapter (loaded as it is saved, the one before unloaded), their logprobs as the trainer
    reads them, and leaves no adapter loaded. The same job through the service, held-out
    evals and a self teacher on the server included, is killed -9 after its state at step
    2; a live worker takes it over, unloads the adapters the dead one left on the server,
    resumes from that state and ends as the `opd run` did: the same tokens and eval
    accuracy, the reverse KL and loss within RESUME_TOLERANCE; nothing of the job's stays
    loaded on the server."""
    from tests.e2e.conftest import deployment

    reference = tmp_path / "reference"
    reference.mkdir()
    metrics = reference / "metrics.jsonl"
    done = run_on_vllm(RESUMED_SPEC, vllm, model_cache, reference, "--metrics-out", str(metrics))
    assert done.returncode == 0, done.stderr
    assert "a probe's logprobs agree with the trainer's" in done.stderr
    expected = {row["step"]: row for row in map(json.loads, metrics.read_text().splitlines())}
    steps = [row for step, row in expected.items() if step < 4]  # step 4: the final eval's
    assert len(steps) == 4 and 4 in expected
    worst = max(row["opd/sampler_logprob_diff_max"] for row in steps)
    print(f"vLLM's rollout logprobs vs the trainer's: max |diff| {worst:.2e}")
    assert worst <= SAMPLER_TOLERANCE
    assert all(0 < row["data/completion_tokens_total"] <= 2 * 8 for row in steps)
    saved = {p.name for p in (reference / "art" / "sampler").iterdir()}
    assert {f"{RESUMED_SPEC['name']}-vllm-{v:06d}" for v in range(4)} <= saved, "each version's"
    evaluated = {step for step, row in expected.items() if "eval/accuracy" in row}
    assert {0, 3} <= evaluated, "held-out evals at their boundaries, sampled on vLLM"
    assert not opd_adapters(vllm), "the run unloaded its adapters"

    servers = json.dumps({SMOLLM2: f"{vllm}/v1"})
    home = tmp_path / "home"
    home.mkdir()
    database = f"sqlite:///{home / 'opd.db'}"
    with deployment(home, database, model_cache=str(model_cache), vllm_servers=servers) as up:
        first = up.start_worker()
        job = up.submit(RESUMED_SPEC)
        up.wait(job["id"], lambda j: j["steps_done"] >= 3, timeout=600)
        assert opd_adapters(vllm), "the adapters the worker killed next leaves"
        first.send_signal(signal.SIGKILL)
        first.wait()
        up.start_worker()
        finished = up.wait(job["id"], timeout=600)
        assert finished["status"] == "succeeded" and finished["attempts"] == 2, up.logs()
        timeline = " | ".join(event.message for event in up.events(job["id"]))
        keys = (*COMPARED, "data/completion_tokens_total", "eval/accuracy")
        curves = {key: dict(up.curve(job["id"], key)) for key in keys}

    assert "Resumed from the state saved at step" in timeline
    assert "adapters an earlier attempt left on the vLLM server" in timeline
    for key, curve in curves.items():
        want = {step: row[key] for step, row in expected.items() if key in row}
        assert sorted(curve) == sorted(want), key
        if key in COMPARED:
            for step, value in curve.items():
                assert value == pytest.approx(want[step], rel=RESUME_TOLERANCE), (key, step)
        else:
            assert curve == want, (key, curve, want)
    assert not opd_adapters(vllm)


def served_names(vllm: str) -> list[str]:
    return [model["id"] for model in httpx.get(f"{vllm}/v1/models", timeout=30).json()["data"]]


def opd_adapters(vllm: str) -> list[str]:
    """The adapters this service loaded that the server still holds."""
    return [name for name in served_names(vllm) if name.startswith("opd-")]


def run_on_vllm(
    spec: dict[str, Any], vllm: str, model_cache: Path, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """`opd run` of `spec`, its student's base model served by `vllm` (OPD_VLLM_SERVERS)."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    env = os.environ | {
        "OPD_MODEL_CACHE": str(model_cache),
        "OPD_VLLM_SERVERS": json.dumps({spec["student"]["base_model"]: f"{vllm}/v1"}),
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "opd.cli", "run", str(path), *args]
    command += ["--artifacts", str(tmp_path / "art")]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def test_a_server_that_reads_other_weights_is_refused_before_the_first_step(
    vllm, model_cache, tmp_path
):
    """The student's base is SmolLM2 with its final norm scaled by 1.05, named to a server
    that serves SmolLM2 itself: the preflight scores a probe with both and refuses."""
    from safetensors.torch import load_file, save_file

    (original,) = model_cache.glob("gguf-*")
    other = tmp_path / "smollm2-other"
    shutil.copytree(original, other)
    (weights,) = other.glob("*.safetensors")
    tensors = load_file(weights)
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.05
    save_file(tensors, weights, metadata={"format": "pt"})
    spec = SPEC | {
        "student": SPEC["student"] | {"base_model": str(other)},
        "teacher": {"base_model": str(other)},
        "sampling": {"max_tokens": 8, "engine": "vllm"},
    }
    done = run_on_vllm(spec, vllm, model_cache, tmp_path)
    assert done.returncode == 1
    assert "scores a probe prompt unlike the trainer (max |logprob difference|" in done.stderr
    assert "step 000" not in done.stderr, "refused before its first step"


def test_the_rollout_engines_benchmark_reports_every_engine(
    vllm, model_cache, tmp_path, monkeypatch
):
    """benchmarks/rollout_engines.py on this module's server, at a tiny size: each engine's
    tokens and speed, the ratios against the local engine (the figures: docs/how-to/vllm.md)."""
    from tests.benchmarks.scripts import run_benchmark

    monkeypatch.setenv("OPD_MODEL_CACHE", str(model_cache))
    out = tmp_path / "figures.json"
    args = ("--rollouts", "4", "--prompts", "2", "--tokens", "4", "--versions", "2")
    args += ("--jobs", "2", "--url", f"{vllm}/v1")
    done = run_benchmark(
        "rollout_engines.py", *args, "--json", str(out), tmp_path=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert sorted(figures) == ["generate", "local", "local_jobs", "vllm", "vllm_base", "vllm_jobs"]
    bound = {"local": 2, "vllm": 2, "local_jobs": 4, "vllm_jobs": 4}  # versions x jobs
    for name, figure in figures.items():
        assert 0 < figure["tokens"] <= 4 * 4 * bound.get(name, 1), (name, figure)
        assert figure["tokens_per_second"] > 0
    assert figures["vllm_jobs"]["tokens"] > figures["vllm"]["tokens"], "both jobs sampled"
    for alone_or_beside in ("vllm", "vllm_jobs"):  # each job's adapter, not another's
        assert figures[alone_or_beside]["logprob_diff_max"] <= SAMPLER_TOLERANCE
    assert "x the local engine" in done.stdout


# The playground on vLLM: a job that samples on vLLM has its checkpoint sampled there.

PLAYGROUND_TOP_K = 3


@pytest.fixture(scope="module")
def on_vllm(vllm: str, model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A service whose API and worker are given this module's server (OPD_VLLM_SERVERS),
    and a job it trained with `sampling.engine: vllm`."""
    from tests.e2e.conftest import deployment

    home = tmp_path_factory.mktemp("playground-on-vllm")
    servers = json.dumps({SMOLLM2: f"{vllm}/v1"})
    database = f"sqlite:///{home / 'opd.db'}"
    with deployment(home, database, model_cache=str(model_cache), vllm_servers=servers) as up:
        up.start_worker()
        spec = SPEC | {"name": "smollm2-vllm-playground"}
        job = up.submit(spec | {"sampling": {"max_tokens": 8, "engine": "vllm"}})
        done = up.wait(job["id"], timeout=900)
        assert done["status"] == "succeeded", (done, up.logs())
        yield up, done


def test_the_playground_of_a_job_on_vllm_samples_its_checkpoint_on_the_server(
    on_vllm, vllm, model_cache, ids
):
    """The playground's checkpoint of a job on vLLM is sampled on the server, as its adapter
    loaded there (its base beside it, on the local engine): the sampled tokens' logprobs,
    the prompt's and their top k, and `/v1/completions`' echo of `job-N`, are the local
    engine's of the same weights; the adapter is unloaded when the worker stops."""
    from pytrio.types import ModelInput, SamplingParams

    from kernel.spec import LocalBackendSpec
    from worker.engine.backends.local import LocalServiceClient

    service, job = on_vllm
    body = {
        "prompt": QUESTION,
        "max_tokens": 8,
        "seed": 1,
        "compare": ["base"],
        "prompt_logprobs": True,
        "top_logprobs": PLAYGROUND_TOP_K,
    }
    asked = httpx.post(
        f"{service.url}/v1/jobs/{job['id']}/sample",
        json=body,
        headers={"Authorization": f"Bearer {service.key}"},
        timeout=600,
    )
    assert asked.status_code == 200, (asked.text, service.logs())
    answer = asked.json()
    adapters = [name for name in served_names(vllm) if name.startswith("opd-play-")]
    assert len(adapters) == 1, "the checkpoint's adapter, loaded on the server"

    local = LocalServiceClient(LocalBackendSpec(device="cpu"), service.home / "local", model_cache)
    # The answer names the weights from the job's folder on (kernel/team_view.py).
    folder = service.home / "artifacts" / answer["outputs"][0]["weights"]

    async def scored(weights: Path | None, ids: list[int], k: int) -> Any:
        sampler = await local.create_sampling_client_async(
            SMOLLM2, model_path=None if weights is None else str(weights)
        )
        return await sampler.sample_async(
            ModelInput.from_ints(ids),
            sampling_params=SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
            topk_prompt_logprobs=k,
        )

    checkpoint, base = answer["outputs"]
    prompt = checkpoint["prompt_token_ids"]
    (completion,) = checkpoint["completions"]
    tokens = completion["token_ids"]
    assert tokens and len(completion["logprobs"]) == len(tokens)
    ours = asyncio.run(scored(folder, prompt + tokens, PLAYGROUND_TOP_K))
    theirs = [*checkpoint["prompt_logprobs"][1:], *completion["logprobs"]]
    worst = max(abs(a - b) for a, b in zip(theirs, ours.prompt_logprobs[1:], strict=True))
    rows = [*checkpoint["prompt_top_logprobs"][1:], *completion["top_logprobs"]]
    for row, local_row in zip(rows, ours.topk_prompt_logprobs[1:], strict=True):
        mine = dict(local_row)
        shared = [(top["token_id"], top["logprob"]) for top in row if top["token_id"] in mine]
        assert len(shared) >= PLAYGROUND_TOP_K - 1, (row, local_row)  # a tie at the k-th
        worst = max(worst, max(abs(v - mine[t]) for t, v in shared))
    print(f"the playground on vLLM vs the local engine: max |diff| {worst:.2e}")
    assert worst <= SERVED_TOLERANCE

    echoed = echo_logprobs(service.url, f"job-{job['id']}", ids, service.key)
    local_echo = np.asarray(asyncio.run(scored(folder, ids, 0)).prompt_logprobs[1:])
    echo_difference = float(np.abs(echoed - local_echo).max())
    print(f"/v1/completions of job-N on vLLM vs the local engine: max |diff| {echo_difference:.2e}")
    assert echo_difference <= SERVED_TOLERANCE

    pairs = zip(checkpoint["prompt_logprobs"][1:], base["prompt_logprobs"][1:], strict=True)
    applied = max(abs(a - b) for a, b in pairs)
    assert applied > 10 * SERVED_TOLERANCE, "the checkpoint's adapter was applied"

    service.stop()
    assert not [name for name in served_names(vllm) if name.startswith("opd-play-")]


def test_a_server_away_for_a_while_is_retried_then_the_error_names_it(vllm, ids, model_cache):
    """The sampler's server unreachable (a relay to it, not listening yet): its requests are
    retried with a warning each until it is back; one away for good fails `vllm_unavailable`
    after its tries."""
    from pytrio.types import ModelInput, SamplingParams

    from kernel.errors import BackendUnavailable
    from kernel.retry import Backoff
    from tests.e2e.servers import Relay
    from worker.engine.backends.local.models import ModelCache, load_tokenizer
    from worker.engine.backends.vllm import VLLMSampler, VLLMServer

    tokenizer = load_tokenizer(SMOLLM2, ModelCache(model_cache))
    relay = Relay(int(vllm.rsplit(":", 1)[1]))
    warnings: list[str] = []
    prompt, params = ModelInput.from_ints(ids[:12]), SamplingParams(max_tokens=4, seed=1)

    async def sample(attempts: int, back_after: float | None) -> Any:
        backoff = Backoff(initial=0.5, cap=1.0, attempts=attempts)
        server = VLLMServer(f"{relay.url}/v1", SMOLLM2, lambda m, d: warnings.append(m), backoff)
        try:
            asked = asyncio.create_task(
                VLLMSampler(server, SMOLLM2, tokenizer).sample_async(prompt, 2, params)
            )
            if back_after is not None:
                await asyncio.sleep(back_after)
                relay.start()
            return await asked
        finally:
            await server.http.aclose()

    answer = asyncio.run(sample(attempts=10, back_after=2.0))
    assert len(answer.sequences) == 2 and all(
        len(s.tokens) == len(s.logprobs) for s in answer.sequences
    )
    assert warnings and all(w.startswith("Retrying the vLLM server") for w in warnings)
    relay.cut()
    warnings.clear()
    with pytest.raises(BackendUnavailable) as away:
        asyncio.run(sample(attempts=3, back_after=None))
    assert away.value.code == "vllm_unavailable" and "OPD_VLLM_SERVERS" in str(away.value)
    assert len(warnings) == 2, "a warning before each retry"


def test_a_seeded_samplers_requests_each_draw_afresh_and_again_on_a_resume(vllm, ids, model_cache):
    """A run's requests all carry the student's seed: each is seeded from it, the sampler's
    version and the request's place (as on the local engine), so successive requests are
    not one random stream drawn again, and a resumed run's sampler repeats its draws."""
    from pytrio.types import ModelInput, SamplingParams

    from worker.engine.backends.local.models import ModelCache, load_tokenizer
    from worker.engine.backends.vllm import VLLMSampler, VLLMServer

    tokenizer = load_tokenizer(SMOLLM2, ModelCache(model_cache))
    prompt = ModelInput.from_ints(ids[:12])
    params = SamplingParams(max_tokens=16, seed=3, temperature=1.0)

    async def draws(version: int) -> list[tuple[int, ...]]:
        server = VLLMServer(f"{vllm}/v1", SMOLLM2)
        sampler = VLLMSampler(server, SMOLLM2, tokenizer, version)
        try:
            answers = [await sampler.sample_async(prompt, 2, params) for _ in range(3)]
        finally:
            await server.http.aclose()
        return [tuple(s.tokens) for answer in answers for s in answer.sequences]

    first, again, later = (asyncio.run(draws(version)) for version in (0, 0, 1))
    assert first[0:2] != first[2:4] != first[4:6], "each request draws afresh"
    assert first == again, "a sampler of the same version draws the same again"
    assert later != first, "the next version's requests draw otherwise"


# The self-distillation teacher on vLLM: with the student's rollouts on the server, a self
# teacher scores there too (its base weights: the served base model; current: each
# completion's adapter), as the same self teacher does in the worker.

SELF_TOLERANCE = 5e-4
"""The self teacher on vLLM against the same self teacher on the local backend, float32
both: each token's logprob of its context, the question, the reference and the answer."""
SELF_CONTEXT = {
    "system": "Answer with the number only.",
    "examples": [{"user": "2 + 2 = ?", "assistant": "4"}],
    "reference": True,
}
REFERENCE = "15"


def self_spec(weights: str, engine: str) -> Any:
    """The module's job with a self teacher of `weights`, its rollouts on `engine`."""
    from kernel.spec import JobSpec

    return JobSpec.model_validate(
        SPEC
        | {
            "teacher": {"self": SELF_CONTEXT | {"weights": weights}},
            "dataset": SPEC["dataset"] | {"prompts": [QUESTION], "answers": [REFERENCE]},
            "sampling": {"max_tokens": 8, "engine": engine},
        }
    )


async def trained_a_step(training: Any, prompt: list[int], completion: list[int]) -> None:
    """One importance-sampling step towards `completion`: an adapter that is not the base."""
    from pytrio.types import AdamParams, ModelInput

    from worker.engine.rollouts.datums import build_opd_datum

    sampler = await training.save_weights_and_get_sampling_client_async()
    scored = await sampler.compute_logprobs_async(ModelInput.from_ints(prompt + completion))
    datum = build_opd_datum(prompt, completion, scored[len(prompt) :], np.ones(len(completion)))
    await (await training.forward_backward_async([datum], loss_fn="importance_sampling"))
    await (await training.optim_step_async(AdamParams(learning_rate=1e-2)))


async def self_teacher_scores(
    vllm: str, model_cache: Path, work: Path
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each weights' self teacher scoring its rendering of the question, the reference and
    the answer: (on the vLLM server, on the local backend), both built by `self_view` as a
    run builds them, a self teacher of `current` weights with the sampler of a trained
    step's adapter (loaded on the server as a run loads it, and the local one)."""
    from pytrio.types import ModelInput

    from kernel.spec import LocalBackendSpec, PromptOptions
    from worker.engine.backends.local import LocalServiceClient
    from worker.engine.backends.vllm import VLLMSampler, VLLMServer
    from worker.engine.data.prompts import build_prompt
    from worker.engine.teachers.views import self_view

    service = LocalServiceClient(LocalBackendSpec(device="cpu"), work, model_cache)
    training = await service.create_lora_training_client_async(SMOLLM2, rank=4, seed=1)
    tokenizer = training.get_tokenizer()
    options = PromptOptions(question_suffix="")
    student_prompt = build_prompt(tokenizer, QUESTION, "", False)
    completion = tokenizer.encode(ANSWER, add_special_tokens=False)
    await trained_a_step(training, student_prompt, completion)
    local_sampler = await training.save_weights_and_get_sampling_client_async()
    saved = await (await training.save_weights_for_sampler_async("self-teacher-current"))
    server = VLLMServer(f"{vllm}/v1", SMOLLM2)
    scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    try:
        served = VLLMSampler(server, await server.load(0, saved.path, set()), tokenizer)
        for weights in ("base", "current"):
            local, on_vllm = [
                await self_view(
                    self_spec(weights, engine),
                    "teacher",
                    service,
                    training,
                    tokenizer,
                    [],
                    server if engine == "vllm" else None,
                )
                for engine in ("local", "vllm")
            ]
            if weights == "base":
                assert isinstance(on_vllm.client, VLLMSampler) and on_vllm.client.model == SMOLLM2
                assert on_vllm.template.startswith(f"server {vllm}/v1, "), on_vllm.template
            pair = []
            for view, sampler in ((on_vllm, served), (local, local_sampler)):
                prompt = view.prompt(QUESTION, options, student_prompt, REFERENCE)
                assert REFERENCE in tokenizer.decode(prompt) and len(prompt) > len(student_prompt)
                client = view.client_for(sampler)
                values = await client.compute_logprobs_async(
                    ModelInput.from_ints(prompt + completion)
                )
                pair.append(np.asarray(values[1:], dtype=np.float64))
            scores[weights] = (pair[0], pair[1])
    finally:
        await server.aclose()
    return scores


def test_the_self_teacher_on_vllm_scores_as_the_worker_local_self_teacher(
    vllm, model_cache, tmp_path
):
    scores = asyncio.run(self_teacher_scores(vllm, model_cache, tmp_path))
    for weights, (theirs, ours) in scores.items():
        difference = float(np.abs(theirs - ours).max())
        print(f"self teacher ({weights}) on vLLM vs the worker's: max |diff| {difference:.2e}")
        assert difference <= SELF_TOLERANCE, weights
    moved = float(np.abs(scores["current"][1] - scores["base"][1]).max())
    assert moved > 10 * SELF_TOLERANCE, "current scores with the trained adapter, base without"


def test_a_job_with_self_teachers_runs_on_vllm(vllm, model_cache, tmp_path):
    """`opd run` of two steps with `sampling.engine: vllm` and two self teachers mixed, one
    of each weights, on two prompts: the rollouts and both teachers' scores on the server
    (sampling and scoring at once, which the CPU build survives one scoring request at a
    time)."""
    teachers = {
        "base": {"self": SELF_CONTEXT},
        "current": {"self": SELF_CONTEXT | {"weights": "current"}},
    }
    spec = SPEC | {
        "teacher": None,
        "teachers": teachers,
        "teacher_mixture": "mixture",
        "dataset": SPEC["dataset"] | {"answers": [REFERENCE, "4"]},
        "sampling": {"max_tokens": 8, "engine": "vllm"},
        "loop": SPEC["loop"] | {"batch_size": 2},
    }
    metrics = tmp_path / "metrics.jsonl"
    done = run_on_vllm(spec, vllm, model_cache, tmp_path, "--metrics-out", str(metrics))
    assert done.returncode == 0, done.stderr
    assert f"Teacher 'base' (self): server {vllm}/v1, the student's own model" in done.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1]
    assert all(row["data/completion_tokens_total"] > 0 for row in rows)
