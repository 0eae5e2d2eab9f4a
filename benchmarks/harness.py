"""The harness the benchmarks share: child processes that are always stopped, a raw
HTTP/1.1 keep-alive client for load generation, latency figures, a throwaway Postgres
database and a private queue. (Scripts run from this folder and import it as `harness`.)"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkProcess
from pathlib import Path
from typing import Any, Protocol

import httpx
import psycopg
from redis.exceptions import RedisError
from support import fresh_database, percentile, private_queue

ROOT = Path(__file__).resolve().parents[1]


class Endpoint(Protocol):
    """Where a load generator's connection sends its one request."""

    @property
    def port(self) -> int: ...

    @property
    def request(self) -> bytes: ...


POSTGRES_ADMIN_URL = os.environ.get(
    "OPD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


DRAIN_SECONDS = 10.0  # how long requests scheduled inside a window may take to come back


STARTUP_SECONDS = 60.0


CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


CONNECTION_CLOSE = re.compile(rb"\r\nconnection:\s*close", re.IGNORECASE)


FORK = multiprocessing.get_context("fork")  # children start at once, modules loaded


class BenchmarkError(Exception):
    """The benchmark cannot run or a part of it failed; the message says what to do."""


def milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def latency_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 and max in milliseconds."""
    ordered = sorted(seconds)
    return {
        f"{name}_ms": milliseconds(percentile(ordered, fraction))
        for name, fraction in (("p50", 0.50), ("p99", 0.99), ("max", 1.0))
    }


@dataclass(frozen=True)
class Window:
    """The measured span, in perf_counter time (uvloop's clock counts whole milliseconds)."""

    start: float
    end: float


class HttpConnection:
    """One keep-alive connection sending the same request again and again; a broken
    connection counts as an error and is reopened for the next request."""

    def __init__(self, target: Endpoint) -> None:
        self.target = target
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def fetch(self) -> bool:
        """Send the request and read the whole response; True when it was a 200."""
        try:
            if self.streams is None:
                self.streams = await asyncio.open_connection("127.0.0.1", self.target.port)
            reader, writer = self.streams
            writer.write(self.target.request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = CONTENT_LENGTH.search(head)
            if length is None:
                raise ConnectionError("a response without Content-Length")
            await reader.readexactly(int(length[1]))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            self.close()
            return False
        if CONNECTION_CLOSE.search(head):
            self.close()
        return head.startswith(b"HTTP/1.1 200 ")

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


async def sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.perf_counter()))


async def cpu_percent(window: Window) -> float:
    """The generator's CPU time during the window, in percent of one core."""
    await sleep_until(window.start)
    cpu, wall = time.process_time(), time.perf_counter()
    await sleep_until(window.end)
    return 100 * (time.process_time() - cpu) / (time.perf_counter() - wall)


async def run_clients(
    clients: Sequence[Coroutine[Any, Any, None]], window: Window
) -> tuple[float, int]:
    """Run the clients with the CPU probe; cut off what is still out DRAIN_SECONDS after
    the window. Returns the generator's CPU percentage and how many clients were cut off."""
    probe = asyncio.create_task(cpu_percent(window))
    tasks = [asyncio.create_task(client) for client in clients]
    _, pending = await asyncio.wait(tasks, timeout=window.end + DRAIN_SECONDS - time.perf_counter())
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return await probe, len(pending)


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh database on the tests' server (OPD_TEST_POSTGRES_URL), dropped afterwards."""
    try:
        with fresh_database(POSTGRES_ADMIN_URL, "opd_bench") as url:
            yield url
    except psycopg.OperationalError as error:
        raise BenchmarkError(
            f"cannot create a Postgres database through {POSTGRES_ADMIN_URL}: {error}\n"
            "Start Postgres, or point OPD_TEST_POSTGRES_URL at a server where you may "
            "create databases."
        ) from None


@contextmanager
def redis_queue(redis_url: str) -> Iterator[str]:
    """A queue name no one else uses; its keys are deleted afterwards."""
    try:
        with private_queue(redis_url, "opd-bench") as queue:
            yield queue
    except RedisError as error:
        raise BenchmarkError(
            f"Redis at {redis_url} does not answer ({error}); start it or pass --redis-url"
        ) from None


@dataclass
class Command:
    """A server started as a command, its output in a log."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def wait_until_serving(self, url: str) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while self.process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise BenchmarkError(
            f"the {self.name} did not answer {url}; its log ends:\n{self.log.read_text()[-3000:]}"
        )


@dataclass
class Child:
    """A function running in a forked process; `result()` waits for its return value."""

    name: str
    process: ForkProcess
    results: Connection

    def result(self) -> Any:
        try:
            value = self.results.recv()
        except EOFError:
            raise BenchmarkError(f"the {self.name} failed: its traceback is above") from None
        self.process.join()
        return value


def child_main(results: Connection, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.setsid()  # Ctrl-C reaches only the parent, which then stops every child in turn
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    results.send(function(*args))


class Processes:
    """Every process the run starts; `close` stops them all, whatever ended the run."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.commands: list[subprocess.Popen[bytes]] = []
        self.children: list[ForkProcess] = []

    def command(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Command:
        """Start a command in a session of its own (so Ctrl-C reaches only this script)."""
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv,
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.commands.append(process)
        return Command(name, process, log)

    def call(self, name: str, function: Callable[..., Any], *args: Any) -> Child:
        receive, send = FORK.Pipe(duplex=False)
        process = FORK.Process(target=child_main, args=(send, function, args), name=name)
        process.start()
        send.close()
        self.children.append(process)
        return Child(name, process, receive)

    def close(self) -> None:
        for process in self.commands:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for child in self.children:
            if child.is_alive():
                child.terminate()
        for process in self.commands:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for child in self.children:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()


def opd(env: dict[str, str], *args: str) -> str:
    """The `opd` command's output (a key, ...); BenchmarkError when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "opd.cli", *args], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise BenchmarkError(f"opd {' '.join(args)} failed: {done.stderr[-2000:]}")
    return done.stdout.strip()


def progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr, flush=True)


def cell(value: float | None) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.1f}"


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def run_benchmark(
    benchmark: Callable[[argparse.Namespace], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    args: argparse.Namespace,
) -> int:
    """Run, print the report and write the figures to `args.json` if given. Exit status:
    0, 1 when the benchmark could not run (the message says why), 130 on Ctrl-C or SIGTERM,
    with everything it started stopped and removed."""
    signal.signal(signal.SIGTERM, interrupt)
    try:
        result = benchmark(args)
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; everything it started was stopped and removed", file=sys.stderr)
        return 130
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
