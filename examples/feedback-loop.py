"""From served answers to better weights, offline on the CPU (docs/how-to/feedback-loop.md).

SmolLM2-135M-Instruct serves under the alias `support-bot` from a job's checkpoint (a
one-step job whose weights are still the base model's). A client sends 60 chats through
the `openai` package with `store: true` and a metadata tag: 40 one-digit arithmetic
questions, which SmolLM2 answers with sentences, and 20 everyday ones. Feedback marks each
arithmetic answer that is not a bare number with the correction "Answer with the number
only". A second job with the same alias distils from those stored completions: the
student answers each stored conversation and learns from its own base weights reading
the correction (`teacher.self.context: feedback`), and from its base as it was on
everyday prompts, so that the format does not leak into everything else. When it
succeeds, `support-bot` names it. Measured before and after, through the same doors:

- compliance: the share of 30 held-out arithmetic questions (never chatted) answered
  with a bare number;
- drift: on 20 held-out everyday questions, the mean reverse KL per token of the served
  model to the base (the playground's `reverse_kl`, logprob minus the base's on each
  sampled token), the figure benchmarks report as `eval/reverse_kl_mean/everyday`.

Run from the repository's root (needs the local and smollm2 extras, `scripts/setup.sh
local,smollm2`): `python examples/feedback-loop.py [--steps 10] [--feedback-only] [--home
DIR] [--out FIGURES.json]`. It starts `opd serve` on a free port under its own OPD_HOME (a
new folder unless --home) and stops it at the end; about 15 minutes on one CPU thread.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from opd.sdk import Client

ROOT = Path(__file__).resolve().parents[1]
EVERYDAY = ROOT / "examples" / "data" / "everyday-prompts.jsonl"
ALIAS = "support-bot"
TAG = "feedback-loop"
CORRECTION = "Answer with the number only"
BARE = re.compile(r"-?[0-9]+")
BAKED_DRIFT = 0.031
"""The prompt-bake example's drift on general questions, nats per token
(benchmarks/real_model.py, docs/concepts/real-models.md)."""


def problems() -> list[tuple[str, int]]:
    """Every one-digit addition, subtraction and product, shuffled once."""
    table = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    found = [
        (f"What is {a} {op} {b}?", table[op](a, b))
        for a, b, op in itertools.product(range(10), range(10), "+-*")
    ]
    random.Random(0).shuffle(found)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`opd serve` under `home`, one job at a time, and its address once it answers."""
    port = free_port()
    env = os.environ | {
        "OPD_HOME": str(home),
        "OPD_WORKER_CONCURRENCY": "1",
        "OPD_SAMPLE_TIMEOUT": "600",
        "OMP_NUM_THREADS": "1",
    }
    log = (home / "serve.log").open("wb")
    command = [sys.executable, "-m", "opd.cli", "serve", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"opd serve exited: see {home / 'serve.log'}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise SystemExit("opd serve did not answer in 5 minutes")


def job(name: str, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "alias": ALIAS,
        "backend": "local",
        "student": {"base_model": "smollm2-135m-instruct", "lora_rank": 16, "seed": 1},
        "sampling": {"max_tokens": 24, "temperature": 1.0},
        "local": {"device": "cpu", "cpu_threads": 1},
    } | more


def served_job(everyday: str) -> dict[str, Any]:
    """The first deployment: SmolLM2 as it is, saved by a one-step job (its teacher is its
    own base and its learning rate negligible, so its weights are the base model's)."""
    return job(
        "smollm2-served",
        teacher={"self": {"weights": "base"}},
        dataset={"source": "file", "file": everyday, "question_suffix": ""},
        optim={"learning_rate": 1e-9},
        loop={"steps": 1, "batch_size": 2, "group_size": 2},
    )


EXAMPLES = [
    {"user": f"What is {question}?\n\nFeedback: {CORRECTION}", "assistant": answer}
    for question, answer in (("2 + 5", "7"), ("9 - 5", "4"), ("4 * 6", "24"))
]
"""Three turns that show the teacher what it reads and how to follow it: a question, the
feedback as the teacher reads it after a stored question (a blank line, `Feedback: `), and
the answer in the corrected format (none is a held-out question)."""


def distil_job(everyday: str, steps: int, examples: bool = True) -> dict[str, Any]:
    """Distil from the stored completions that have feedback, the base reading it (after
    three example turns unless `examples` is False: SmolLM2-135M does not follow the
    correction from the words alone); keep the base on everyday prompts."""
    corrected = {"weights": "base", "context": "feedback"}
    return job(
        "smollm2-feedback",
        teachers={
            "corrected": {"self": corrected | ({"examples": EXAMPLES} if examples else {})},
            "base": {"self": {"weights": "base"}},
        },
        teacher_mixture="route",
        datasets=[
            {
                "name": "served",
                "source": "stored_completions",
                "filter": {"metadata": {"app": TAG, "kind": "arithmetic"}, "has_feedback": True},
                "teacher": "corrected",
                "weight": 2,
            },
            {
                "name": "everyday",
                "source": "file",
                "file": everyday,
                "question_suffix": "",
                "teacher": "base",
                "weight": 1,
            },
        ],
        optim={"learning_rate": 5e-4},
        loop={"steps": steps, "batch_size": 12, "group_size": 2, "objective": "reverse_kl"},
    )


def compliance(client: openai.OpenAI, questions: list[str]) -> float:
    """The share of the questions `support-bot` answers with a bare number."""
    bare = 0
    for seed, question in enumerate(questions):
        answer = client.chat.completions.create(
            model=ALIAS,
            messages=[{"role": "user", "content": question}],
            max_tokens=24,
            temperature=1.0,
            seed=seed,
        )
        bare += BARE.fullmatch((answer.choices[0].message.content or "").strip()) is not None
    return bare / len(questions)


def drift(opd: Client, job_id: int, questions: list[str], teacher: str | None) -> float:
    """The job's mean reverse KL per token to its base model on the questions, its own
    samples scored by `teacher`, a teacher of the job that is its base as it was (no
    context)."""
    kl: list[float] = []
    for seed, question in enumerate(questions):
        answer = opd.jobs.playground(
            job_id,
            messages=[{"role": "user", "content": question}],
            max_tokens=48,
            seed=seed,
            compare=["teacher"],
            teacher=teacher,
            timeout_seconds=600,
        )
        completion = answer.outputs[0].completions[0]
        kl += [value for value in completion.reverse_kl or [] if value is not None]
    return sum(kl) / len(kl)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="the distillation job's steps")
    parser.add_argument("--home", type=Path, help="the service's OPD_HOME (default: a new one)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument(
        "--feedback-only",
        action="store_true",
        help="the teacher reads the feedback alone, without the three example turns",
    )
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="opd-feedback-loop-"))
    home.mkdir(parents=True, exist_ok=True)
    arithmetic = problems()
    chatted, held_out = [q for q, _ in arithmetic[:40]], [q for q, _ in arithmetic[40:70]]
    everyday = [json.loads(line)["question"] for line in EVERYDAY.read_text().splitlines()]
    train_everyday, drift_questions = everyday[:120], everyday[150:170]
    (home / "everyday.jsonl").write_text(
        "".join(json.dumps({"question": q}) + "\n" for q in train_everyday)
    )

    service, url = start_service(home)
    started = time.monotonic()
    try:
        key = (home / "api-key").read_text().strip()
        chat = openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=900, max_retries=0)
        with Client(url, key, timeout=900) as opd:
            file = opd.files.upload(home / "everyday.jsonl", field="question", progress=False)
            served = opd.jobs.create(served_job(file.id)).wait(timeout=3600)
            assert served.status == "succeeded", served.error
            print(f"job {served.id} serves as {ALIAS} (SmolLM2 as it is)", flush=True)

            before = compliance(chat, held_out)
            print(f"compliance before: {before:.1%}", flush=True)
            for seed, (kind, question) in enumerate(
                [("arithmetic", q) for q in chatted] + [("everyday", q) for q in everyday[120:140]]
            ):
                chat.chat.completions.create(
                    model=ALIAS,
                    messages=[{"role": "user", "content": question}],
                    max_tokens=32,
                    seed=seed,
                    store=True,
                    metadata={"app": TAG, "kind": kind},
                )
            stored = list(opd.stored_completions.list(metadata={"app": TAG, "kind": "arithmetic"}))
            corrected = [c for c in stored if BARE.fullmatch(c.answer().strip()) is None]
            for completion in corrected:
                opd.stored_completions.feedback(
                    completion.id, rating=-1, correction=CORRECTION, author="feedback-loop.py"
                )
            print(f"stored 60 chats; corrected {len(corrected)} of 40 arithmetic answers")

            drift_before = drift(opd, served.id, drift_questions, None)
            distil = distil_job(file.id, args.steps, not args.feedback_only)
            tuned = opd.jobs.create(distil).wait(timeout=6 * 3600)
            assert tuned.status == "succeeded", tuned.error
            loaded = next(e for e in opd.jobs.events(tuned.id) if "stored_completions" in e.message)
            print(loaded.message)
            named = chat.chat.completions.create(
                model=ALIAS, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
            ).model
            after = compliance(chat, held_out)
            drift_after = drift(opd, tuned.id, drift_questions, "base")
    finally:
        service.terminate()
        service.wait(timeout=600)
    figures = {
        "corrected": len(corrected),
        "compliance_before": before,
        "compliance_after": after,
        "drift_before": drift_before,
        "drift_after": drift_after,
        "alias_names": named,
        "distil_job": f"job-{tuned.id}",
        "steps": args.steps,
        "teacher_examples": not args.feedback_only,
        "minutes": (time.monotonic() - started) / 60,
    }
    print(
        f"{ALIAS} now names {named} (the distillation job: job-{tuned.id})\n"
        f"bare-number answers on 30 held-out questions: {before:.1%} -> {after:.1%}\n"
        f"drift on 20 held-out everyday questions: {drift_before:.3f} -> {drift_after:.3f} "
        f"nats/token (the prompt-bake example's: {BAKED_DRIFT})"
    )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
