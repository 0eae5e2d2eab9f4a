"""Running a reader of untrusted bytes in a child process with its own memory, CPU and
core-file limits, so that a crash, a bomb or a loop there costs the child, never the
caller: each is a FileUnreadable that says which limit the file met. The memory limit is
the child's address space (on Linux, which /proc measures); Arrow's threads are capped there.

Children come from multiprocessing's fork server, a small process that imports the
readers once and forks a child per call: a fork of the API or the worker, which run
threads, could deadlock, and a fresh interpreter per call would take a second to import
pyarrow. At most SLOTS children run at once in a process; other calls wait their turn.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import pyarrow

from kernel.errors import FileUnreadable

T = TypeVar("T")

SLOTS = 2
READER_THREADS = 2
WALL_SECONDS_PER_CPU_SECOND = 3
STOP_SECONDS = 5
MIB = 1 << 20

_slots = threading.BoundedSemaphore(SLOTS)
_preloaded = {"__main__"}
"""The fork server imports these when it starts. `__main__` among them: else every child
would run the caller's main script again (multiprocessing's spawn rule)."""


def run_confined(
    function: Callable[..., T], args: tuple[Any, ...], *, memory_bytes: int, cpu_seconds: int
) -> T:
    """function(*args) in a child that may add `memory_bytes` of address space to what it
    starts with and use `cpu_seconds` of CPU (three times that in wall time); what it
    raises is raised here (a MemoryError as FileUnreadable). Blocking."""
    context = multiprocessing.get_context("forkserver")
    preload(context, function.__module__)
    wall_seconds = cpu_seconds * WALL_SECONDS_PER_CPU_SECOND
    with _slots:
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(
            target=run_child,
            args=(sender, function, args, memory_bytes, cpu_seconds),
            daemon=True,
        )
        child.start()
        sender.close()
        try:
            answered = receiver.poll(wall_seconds)
            outcome = receiver.recv() if answered else None
        except EOFError:
            outcome = None
        finally:
            receiver.close()
            stop(child)
    if outcome is None:
        raise FileUnreadable(ending(child.exitcode, answered, wall_seconds, cpu_seconds))
    done, value = outcome
    if done:
        return value
    raise value


def preload(context: Any, module: str) -> None:
    """Have the fork server import `module` when it starts (once it runs, its children
    import what their function needs themselves)."""
    if module not in _preloaded:
        _preloaded.add(module)
        context.set_forkserver_preload(sorted(_preloaded))


def stop(child: multiprocessing.process.BaseProcess) -> None:
    child.join(STOP_SECONDS)
    if child.is_alive():
        child.kill()
        child.join()


def ending(exitcode: int | None, answered: bool, wall_seconds: int, cpu_seconds: int) -> str:
    """Why a child gave no answer, as the refusal says it."""
    if not answered:
        return f"reading the file took more than {wall_seconds} s; upload a smaller or simpler file"
    if exitcode in (-signal.SIGXCPU, -signal.SIGKILL):
        return (
            f"reading the file took more than {cpu_seconds} s of CPU; upload a smaller or "
            "simpler file"
        )
    if exitcode is not None and exitcode < 0:
        return (
            f"reading the file crashed its reader ({signal.Signals(-exitcode).name}); check "
            "that it opens with pyarrow, or upload a smaller or simpler file"
        )
    return f"the reader stopped on this file (exit status {exitcode}); upload it again"


def run_child(
    sender: Connection,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    memory_bytes: int,
    cpu_seconds: int,
) -> None:
    confine(memory_bytes, cpu_seconds)
    try:
        outcome: tuple[bool, Any] = (True, function(*args))
    except MemoryError:
        outcome = (False, FileUnreadable(out_of_memory(memory_bytes)))
    except Exception as error:
        outcome = (False, error)
    try:
        sender.send(outcome)
    except Exception as error:  # an answer that does not pickle
        sender.send((False, FileUnreadable(f"the reader failed: {type(error).__name__}")))
    finally:
        sender.close()


def out_of_memory(memory_bytes: int) -> str:
    return (
        f"reading the file needed more than {memory_bytes // MIB} MiB of memory (a Parquet "
        "column that repeats one long value in every row does this); upload a smaller or "
        "simpler file"
    )


def confine(memory_bytes: int, cpu_seconds: int) -> None:
    # The system allocator, and few reader threads: Arrow's own allocator reserves address
    # space by the gigabyte, and each thread's stack and malloc arena take some, which must
    # not grow with the machine's cores. Arrow's C++ parts still allocate a little from its
    # own: its first reservation is made here, before the address space is measured.
    pyarrow.allocate_buffer(1, memory_pool=pyarrow.default_memory_pool())
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())
    pyarrow.set_cpu_count(READER_THREADS)
    pyarrow.set_io_thread_count(READER_THREADS)
    lower(resource.RLIMIT_CORE, 0, 0)
    lower(resource.RLIMIT_CPU, cpu_seconds, cpu_seconds + 1)
    mapped = mapped_bytes()
    if mapped is not None:
        lower(resource.RLIMIT_AS, mapped + memory_bytes, mapped + memory_bytes)


def lower(limit: int, soft: int, hard: int) -> None:
    """Set a limit no higher than the one the process has."""
    _, current = resource.getrlimit(limit)
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(limit, (soft, hard))


def mapped_bytes() -> int | None:
    """The process's address space now; None where /proc does not say (not Linux, where
    the memory limit is not set: the CPU limit and the bounds still hold)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except FileNotFoundError:
        return None
