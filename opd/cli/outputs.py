"""The commands that use what a job produced: `opd playground` (try a checkpoint, beside
the teacher and the untrained student; `opd sample` is its old name), `opd clone` (a new
job from a job's spec, changed) and `opd export` (a checkpoint's weights as a folder, or
merged into a plain Hugging Face model). They talk to the API; only `export --merge` loads
a model, here, on the CPU."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import warnings
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from app.jobs.schemas import TERMINAL_STATUSES
from kernel.errors import OPDError
from kernel.json_types import load_yaml
from kernel.merge_patch import dotted_patch
from kernel.spec import stored_spec
from kernel.summary import summary_lines
from opd.cli.common import CommandError, api_options, client, example, label, renamed
from opd.cli.shading import printable, shaded_tokens, wants_color, worst_tokens

if TYPE_CHECKING:
    from app.jobs.schemas import CheckpointPublic, JobPublic
    from app.playground.schemas import PlaygroundAnswer
    from kernel.playground import Completion
    from opd.cli.common import Commands
    from opd.sdk import Client


def checkpoint_ref(text: str) -> str | int:
    """`final` or a step number, as the API names saved weights."""
    if text == "final":
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is neither 'final' nor a step number")


def assignment(text: str) -> tuple[str, Any]:
    """`optim.learning_rate=2e-5` as (path, value); the value is read as JSON, then YAML,
    else kept as a string (`null` returns a field to its default)."""
    path, sep, raw = text.partition("=")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not FIELD=VALUE")
    try:
        return path, json.loads(raw)
    except ValueError:
        pass
    try:
        return path, load_yaml(raw)
    except yaml.YAMLError:
        return path, raw


def completion_text(completion: Completion, color: bool) -> str:
    kls = completion.reverse_kl
    if kls is None:
        return printable(completion.text)
    if color:
        return shaded_tokens(completion.tokens, kls)
    worst = worst_tokens(completion.tokens, kls)
    return f"{printable(completion.text)}\nhighest reverse KL: {worst}"


def answer_lines(answer: PlaygroundAnswer, color: bool) -> list[str]:
    checkpoint = answer.checkpoint
    lines = [
        f"job {answer.job_id}: {checkpoint.kind} weights after step {checkpoint.step}; "
        f"prompt {answer.prompt_tokens} tokens; {answer.seconds:.2f} s on the worker"
    ]
    for output in answer.outputs:
        kl = output.reverse_kl_mean
        cached = "cached" if output.cached else "loaded"
        stored = output.stored_completion_id
        lines.append(
            f"--- {output.model} ({output.base_model}, {cached})"
            + ("" if kl is None else f": reverse KL mean {kl:.4f}")
            + ("" if stored is None else f"; stored as {stored}")
        )
        for index, completion in enumerate(output.completions, start=1):
            lines.append(
                f"[{index}] ({completion.stop_reason}) {completion_text(completion, color)}"
            )
    return lines


def chat(text: str) -> list[dict[str, str]]:
    """`--messages`: a JSON (or YAML) list of {role, content}, or `@FILE` holding one."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as error:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]}: {error.strerror}") from None
    try:
        messages = yaml.safe_load(text)
    except yaml.YAMLError:
        messages = None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise argparse.ArgumentTypeError(
            'give a list of messages, e.g. \'[{"role": "user", "content": "Compute 7 * 8."}]\''
        )
    return messages


def playground_command(args: argparse.Namespace) -> int:
    if (args.prompt is None) == (args.messages is None):
        raise CommandError("give a PROMPT or --messages (one of them)")
    answer = client(args).jobs.playground(
        args.job,
        args.prompt,
        messages=args.messages,
        checkpoint=args.checkpoint,
        model=args.model,
        n=args.n,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        stop=args.stop,
        seed=args.seed,
        compare=args.compare,
        teacher=args.teacher,
        timeout_seconds=args.timeout,
        store=args.store,
        metadata=dict(args.metadata or []) or None,
    )
    print("\n".join(answer_lines(answer, wants_color())))
    return 0


def clone_command(args: argparse.Namespace) -> int:
    try:
        patch = dotted_patch(dict(args.set))
    except ValueError as error:
        raise CommandError(str(error)) from None
    if args.init_from is not None:
        init = {
            "job": args.job,
            "checkpoint": args.init_from,
            "with_optimizer": args.with_optimizer,
        }
        patch.setdefault("student", {})["init_from"] = init
    job = client(args).jobs.clone(args.job, patch, idempotency_key=args.idempotency_key)
    print(job.id if args.quiet else f"Cloned job {args.job} as job {job.id} ({job.status})")
    return 0


def find_weights(api: Client, job_id: int, ref: str | int) -> CheckpointPublic:
    """The job's weights: its final ones, or its sampler weights saved after a step (else
    the state saved then). A job that ended without final weights (cancelled, failed)
    gives its last state: it will never have more."""
    saved = list(api.jobs.checkpoints(job_id, page_size=1000))
    if ref == "final":
        found = [c for c in saved if c.kind == "final"]
        states = [c for c in saved if c.kind == "state"]
        if not found and states and (job := api.jobs.get(job_id)).status in TERMINAL_STATUSES:
            last = states[-1]
            print(
                f"job {job_id} is {job.status} and has no final weights: exporting its last "
                f"state (step {last.step}) instead",
                file=sys.stderr,
            )
            return last
    else:
        at_step = [c for c in saved if c.step == ref]
        found = [c for c in at_step if c.kind in ("sampler", "final")] or [
            c for c in at_step if c.kind == "state"
        ]
    if not found:
        steps = sorted({c.step for c in saved})
        asked = "final weights" if ref == "final" else f"weights saved after step {ref}"
        have = (
            f"it has weights saved after steps {', '.join(map(str, steps))}"
            if steps
            else "it has saved none yet"
        )
        raise CommandError(f"job {job_id} has no {asked}; {have}")
    return found[-1]


def unpack(archive: Path, into: Path, saved_at: datetime) -> Path:
    """The folder the archive holds (its one top-level entry, or `into` itself), its files
    dated when the checkpoint was saved (the archive itself dates them 1970, to keep its
    digest the same whenever it is made)."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    stamp = saved_at.timestamp()
    for path in [into, *into.rglob("*")]:
        os.utime(path, (stamp, stamp))
    entries = list(into.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else into


def export_command(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CommandError(f"{out} exists and is not an empty folder")
    api = client(args)
    weights = find_weights(api, args.job, args.checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="opd-export-", dir=out.parent.resolve()) as work:
        archive = Path(work, "checkpoint.tar.gz")
        sha256 = api.jobs.download(args.job, weights.id, archive).sha256
        folder = unpack(archive, Path(work, "unpacked"), weights.created_at)
        what = f"job {args.job}'s {weights.kind} weights (step {weights.step})"
        job = api.jobs.get(args.job)
        if not args.merge:
            Path(folder, "README.md").write_text(model_card(job, weights, merged=False))
            if out.exists():
                out.rmdir()
            shutil.move(folder, out)
            print(f"Wrote {what} to {out} (archive SHA-256 {sha256})")
            return 0
        thinking = stored_spec(job.spec).dataset_shares()[0]
        merged = merge(folder, out, args.base_model, args.dtype, thinking.enable_thinking)
        Path(out, "README.md").write_text(model_card(job, weights, merged=True))
    print(
        f"Wrote a Hugging Face model to {out}: {merged.base_model} with the LoRA of {what} "
        f"merged in. Its logprobs match the adapter model's on a probe prompt (relative "
        f"difference {merged.relative_error:.2g}, at most {merged.rtol:g})."
    )
    return 0


def model_card(job: JobPublic, weights: CheckpointPublic, merged: bool) -> str:
    """The exported folder's README: what the weights were trained from and how, the prompt
    format they learned, and the job's figures (PEFT's own card is a blank template)."""
    spec = stored_spec(job.spec)
    student, loop = spec.student, spec.loop
    teachers = ", ".join(
        f"`{teacher.base_model}`" + ("" if name == "teacher" else f" ({name})")
        for name, teacher in spec.teacher_specs().items()
    )
    shares = spec.dataset_shares()
    prompts = [
        f"- `{share.name}`: questions from `{share.source}`"
        + (f" (`{share.file}`)" if getattr(share, "file", None) else "")
        + (f", each followed by {share.question_suffix!r}" if share.question_suffix else "")
        + f", rendered by the chat template of `{student.base_model}`"
        + f" (enable_thinking: {str(share.enable_thinking).lower()})"
        for share in shares
    ]
    figures = summary_lines(job.summary) or ["(no figures recorded)"]
    form = "a Hugging Face model: the LoRA merged into" if merged else "a LoRA adapter (PEFT) for"
    front = "" if merged else f"---\nbase_model: {student.base_model}\nlibrary_name: peft\n---\n\n"
    return (
        f"{front}# {spec.name}: job {job.id}'s {weights.kind} weights after step {weights.step}\n\n"
        f"This folder is {form} `{student.base_model}`, trained by on-policy distillation "
        f"(the OPD service) from {teachers}: {loop.steps} steps of {loop.batch_size} prompts "
        f"x {loop.group_size} completions, objective `{loop.objective.kind}`, learning rate "
        f"{spec.optim.learning_rate:g}, LoRA rank {student.lora_rank}, seed {student.seed} "
        f"(job status: {job.status}).\n\n"
        "## Prompt format\n\nAsk it as it was trained: one user turn holding the question "
        "and its suffix.\n\n"
        + "\n".join(prompts)
        + "\n\n## Figures\n\n"
        + "\n".join(f"- {line}" for line in figures)
        + f"\n\nThe job's whole spec: `GET /v1/jobs/{job.id}` (its `spec`); train more like "
        f"it: `opd clone {job.id}`.\n"
    )


def merge(
    folder: Path, out: Path, base_model: str | None, dtype: str, enable_thinking: bool
) -> Any:
    """The merge, with the local backend's model code (torch, transformers, peft); the
    exported chat template renders as the job's training did (`enable_thinking`)."""
    # start-up time: torch and transformers
    import torch
    from transformers.utils import logging as hf_logging

    from worker.engine.backends.local.export import merge_adapter
    from worker.engine.backends.local.gguf import default_model_cache
    from worker.engine.backends.local.models import ModelCache

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    cache = ModelCache(default_model_cache(), lambda message, data: print(message, file=sys.stderr))
    with warnings.catch_warnings():  # the libraries' notes to their developers, not to you
        warnings.simplefilter("ignore")
        try:
            return merge_adapter(
                folder, out, base_model, getattr(torch, dtype), enable_thinking, cache
            )
        except OPDError as error:
            raise CommandError(f"[{error.code}] {error}") from error


def playground_options(playground: argparse.ArgumentParser) -> None:
    playground.add_argument("job", type=int, help="the job's id")
    playground.add_argument(
        "prompt", nargs="?", help="a question, rendered as the job rendered its prompts"
    )
    playground.add_argument(
        "--messages",
        type=chat,
        metavar="JSON|@FILE",
        help="a chat instead of PROMPT, rendered with the student's chat template",
    )
    playground.add_argument("--checkpoint", type=checkpoint_ref, default="final", help="final or N")
    playground.add_argument(
        "--model",
        choices=["checkpoint", "teacher", "base"],
        default="checkpoint",
        help="the model that answers (default: the checkpoint)",
    )
    playground.add_argument(
        "--compare",
        action="append",
        choices=["teacher", "base"],
        default=[],
        help="also the teacher / the untrained student (repeatable)",
    )
    playground.add_argument("--teacher", help="which of several teachers to compare, by name")
    playground.add_argument("-n", type=int, default=1, help="completions per model (default 1)")
    playground.add_argument(
        "--max-tokens", type=int, default=256, help="tokens a completion may have (256)"
    )
    playground.add_argument(
        "--temperature", type=float, default=1.0, help="the sampling temperature (1.0)"
    )
    playground.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (1.0)")
    playground.add_argument(
        "--stop", action="append", default=[], help="a string that ends a completion (repeatable)"
    )
    playground.add_argument("--seed", type=int, help="the sampler's seed")
    playground.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (60)")
    playground.add_argument(
        "--store",
        action="store_true",
        help="keep each model's answers as a stored completion (opd feedback list shows them)",
    )
    playground.add_argument(
        "--metadata",
        type=label,
        action="append",
        metavar="KEY=VALUE",
        help="with --store: a label kept with them (repeatable, up to 16)",
    )
    playground.set_defaults(handler=playground_command)


def add_parsers(commands: Commands) -> None:
    http = api_options()
    for name in ("playground", "sample"):
        playground = commands.add_parser(
            name,
            parents=[http],
            help="complete a prompt with a job's checkpoint (a worker does)"
            if name == "playground"
            else "deprecated: opd playground",
        )
        playground_options(playground)
        example(playground, 'opd playground 1 "What is 2 + 3?" --compare teacher --seed 1')
    renamed(playground, "opd sample", "opd playground")

    clone = commands.add_parser("clone", parents=[http], help="a new job from a job's spec")
    clone.add_argument("job", type=int, help="the job whose spec to start from")
    clone.add_argument(
        "--set",
        type=assignment,
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="change a spec field, e.g. optim.learning_rate=2e-5 (null: back to its default)",
    )
    clone.add_argument(
        "--init-from",
        type=checkpoint_ref,
        metavar="final|N",
        help="continue training from this job's state saved then",
    )
    clone.add_argument("--with-optimizer", action="store_true", help="restore Adam's state too")
    clone.add_argument("--idempotency-key", help="cloning again with the same key is safe")
    clone.add_argument("--quiet", action="store_true", help="print the new job's id only")
    example(clone, "opd clone 1 --set optim.learning_rate=2e-3 --set loop.steps=200")
    clone.set_defaults(handler=clone_command)

    export = commands.add_parser(
        "export", parents=[http], help="a checkpoint's weights in a folder (--merge: a HF model)"
    )
    export.add_argument("job", type=int, help="the job's id")
    export.add_argument("out", metavar="OUT_DIR", help="a new or empty folder to write into")
    export.add_argument("--checkpoint", type=checkpoint_ref, default="final", help="final or N")
    export.add_argument(
        "--merge",
        action="store_true",
        help="merge the LoRA into the base model: a plain Hugging Face model (needs torch)",
    )
    export.add_argument(
        "--base-model", help="the base model to merge into (default: the saved one's)"
    )
    export.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="with --merge: the merged model's (float32)",
    )
    example(export, "opd export 1 job-1-final")
    export.set_defaults(handler=export_command)
