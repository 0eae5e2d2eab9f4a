"""Grading the student's answers: the last `\\boxed{...}` of a completion, checked against a
reference answer with math-verify, and pass@k over the verdicts; or the answer's form alone,
a regular expression its stripped text must match as a whole (`format_grader`).

math-verify interrupts slow work with SIGALRM, which only reaches a process's main thread,
and some answers make sympy work for minutes. So every answer is graded in a small pool of
worker processes, under a per-answer alarm of our own; a worker that overruns it anyway (stuck
where no signal gets through, or dead) is killed with its pool, and a fresh pool takes over.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import re
import signal
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from enum import StrEnum
from multiprocessing.synchronize import Barrier
from types import FrameType, TracebackType

import regex

from worker.engine.eval.evaluation import Grade

# A fresh pool's workers import sympy and warm it up; on a busy machine that takes seconds.
STARTUP_TIMEOUT_S = 120.0
# How often one answer is sent again after its pool broke under it (another answer may have
# broken it) before it counts as timed out.
ATTEMPTS = 3

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_UNBRACED_BOX = re.compile(r"\s*([^\s$]+)")


REGEX_TIMEOUT_S = 1.0
"""The longest one answer is matched against a format's pattern (a pattern that
backtracks without end fails the answer, never the run)."""


def format_grader(pattern: str) -> Grade:
    """A grader of form: whether each completion's text, stripped, matches `pattern` as a
    whole (the references are not read). Matched off the event loop, each answer for at
    most REGEX_TIMEOUT_S."""
    compiled = regex.compile(pattern)

    def matches(text: str) -> bool:
        try:
            return compiled.fullmatch(text.strip(), timeout=REGEX_TIMEOUT_S) is not None
        except TimeoutError:
            return False

    async def grade(completions: list[str], references: list[str]) -> list[bool]:
        return await asyncio.to_thread(lambda: [matches(text) for text in completions])

    return grade


class Verdict(StrEnum):
    """What grading one answer found; only `CORRECT` counts towards accuracy."""

    CORRECT = "correct"
    WRONG = "wrong"
    UNPARSEABLE = "unparseable"  # the answer is no mathematical expression math-verify reads
    TIMEOUT = "timeout"  # grading ran past its time limit, or its worker process died
    NO_ANSWER = "no_answer"  # the completion has no complete \boxed{...}


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) in `text`.

    Braces nest (`\\boxed{\\frac{1}{2}}`) and escaped ones (`\\{`) do not count. None when there
    is no box, or when the last one never closes: a truncated completion has no answer, even
    if an earlier box has one.
    """
    boxes = list(_BOX_COMMAND.finditer(text))
    if not boxes:
        return None
    rest = text[boxes[-1].end() :]
    if not rest.lstrip().startswith("{"):
        unbraced = _UNBRACED_BOX.match(rest)
        return unbraced.group(1) if unbraced else None
    start = rest.index("{") + 1
    depth = 1
    position = start
    while position < len(rest):
        char = rest[position]
        if char == "\\":
            position += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[start:position].strip()
        position += 1
    return None


def pass_at_k(correct_per_prompt: Sequence[Sequence[bool]], k: int) -> float:
    """The unbiased pass@k estimator of Chen et al. 2021, averaged over prompts.

    For a prompt with n samples of which c are correct, 1 - C(n-c, k) / C(n, k): the chance
    that k samples drawn without replacement include a correct one, computed as a product
    so that large n does not overflow.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if not correct_per_prompt:
        raise ValueError("pass@k needs at least one prompt")
    total = 0.0
    for flags in correct_per_prompt:
        n, c = len(flags), sum(flags)
        if n < k:
            raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
        if n - c < k:
            total += 1.0
        else:
            total += 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
    return total / len(correct_per_prompt)


class Grader:
    """Grades (answer, reference) pairs in a pool of `workers` processes; use it in `async with`.

    Each answer gets `timeout_s` in a worker and is graded TIMEOUT past that. A worker that
    has not answered `kill_after_s` later is presumed stuck: the answer is graded TIMEOUT, its
    pool is killed and replaced, and the other answers the pool held are graded again. Use one
    Grader from one event loop.
    """

    def __init__(
        self, workers: int = 2, timeout_s: float = 5.0, kill_after_s: float = 10.0
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self.timeout_s = timeout_s
        self.kill_after_s = kill_after_s
        self._pool: ProcessPoolExecutor | None = None
        # Two answers in flight per worker: the next one waits in the pool's queue, so no
        # worker idles between answers, and it waits for at most one answer's time limit.
        self._slots = asyncio.Semaphore(2 * workers)
        self._starting = asyncio.Lock()

    async def __aenter__(self) -> Grader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers; nothing they were doing is needed any more."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            _stop(pool, wait=True)

    async def grade(self, pairs: Sequence[tuple[str | None, str]]) -> list[Verdict]:
        """One verdict per (answer from `last_boxed`, reference answer) pair, in order."""
        return list(await asyncio.gather(*(self._grade_one(a, ref) for a, ref in pairs)))

    async def grade_answers(self, completions: list[str], references: list[str]) -> list[bool]:
        """Whether the last box of each completion holds its reference answer (accuracy)."""
        pairs = zip(map(last_boxed, completions), references, strict=True)
        return [verdict is Verdict.CORRECT for verdict in await self.grade(list(pairs))]

    async def _grade_one(self, answer: str | None, reference: str) -> Verdict:
        if answer is None:
            return Verdict.NO_ANSWER
        # Its wait in the pool's queue (one answer's limit at most), its own limit, then
        # kill_after_s for a worker still busy past it.
        deadline_s = 2 * self.timeout_s + self.kill_after_s
        async with self._slots:
            for _ in range(ATTEMPTS):
                pool = await self._ready_pool()
                try:
                    future = pool.submit(_grade_in_worker, answer, reference, self.timeout_s)
                    return await asyncio.wait_for(asyncio.wrap_future(future), deadline_s)
                except TimeoutError:
                    self._discard(pool)
                    return Verdict.TIMEOUT
                except BrokenProcessPool:
                    self._discard(pool)
            return Verdict.TIMEOUT

    async def _ready_pool(self) -> ProcessPoolExecutor:
        """The current pool, started first if there is none, once all its workers are up."""
        async with self._starting:
            if self._pool is None:
                self._pool = await self._start_pool()
            return self._pool

    async def _start_pool(self) -> ProcessPoolExecutor:
        # spawn: a fork of a process that runs torch or asyncio threads may deadlock.
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(
            self.workers,
            mp_context=context,
            initializer=_start_worker,
            initargs=(context.Barrier(self.workers),),
        )
        # Each submission to a pool without an idle worker spawns one, so this starts all of
        # them; the barrier holds every task until every worker is ready.
        started = [asyncio.wrap_future(pool.submit(int)) for _ in range(self.workers)]
        try:
            await asyncio.wait_for(asyncio.gather(*started), STARTUP_TIMEOUT_S)
        except BaseException:
            _stop(pool, wait=False)
            raise
        return pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        """Kill a pool found stuck or broken, once, so the next answer starts a fresh one."""
        if self._pool is pool:
            self._pool = None
            _stop(pool, wait=False)


def _stop(pool: ProcessPoolExecutor, wait: bool) -> None:
    """Kill a pool's workers, busy or not, then shut it down (`wait`: until they are reaped)."""
    # ProcessPoolExecutor itself can only wait for busy workers (until 3.14's kill_workers).
    for process in list(pool._processes.values()):
        process.kill()
    pool.shutdown(wait=wait, cancel_futures=True)


class _AnswerTimeout(BaseException):
    """Raised by SIGALRM in a worker; a BaseException, so math-verify's handlers let it by."""


def _raise_timeout(signum: int, frame: FrameType | None) -> None:
    raise _AnswerTimeout


def _start_worker(barrier: Barrier) -> None:
    """Prepare a pool process: signals, a warm sympy, then wait for the other workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGALRM, _raise_timeout)
    # math-verify warns that its own alarms are off; ours replace them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _verdict("\\frac{1}{2}", "0.5")
    barrier.wait(STARTUP_TIMEOUT_S)


def _grade_in_worker(answer: str, reference: str, timeout_s: float) -> Verdict:
    """Grade one answer in a pool process, under an alarm of `timeout_s`."""
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return _verdict(answer, reference)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _AnswerTimeout:
        return Verdict.TIMEOUT


def _verdict(answer: str, reference: str) -> Verdict:
    # Imported here: only pool processes need sympy, and it takes a second to import.
    from math_verify import LatexExtractionConfig, parse, verify

    # Both are the insides of a \boxed{}, so both are read as LaTeX in a box. math-verify's
    # own timeouts are off: their alarms would replace ours.
    config = [LatexExtractionConfig(boxed_match_priority=0)]
    gold = parse(f"\\boxed{{{reference}}}", extraction_config=config, parsing_timeout=None)
    predicted = parse(f"\\boxed{{{answer}}}", extraction_config=config, parsing_timeout=None)
    if verify(gold, predicted, timeout_seconds=None):
        return Verdict.CORRECT
    if all(isinstance(parsed, str) for parsed in predicted):
        return Verdict.UNPARSEABLE  # only the raw text came back: sympy could not read it
    return Verdict.WRONG
