"""The grader on real math answers, through real math-verify in real worker processes: what
it accepts as equal, what it refuses, what it cannot read, and how it survives answers that
take too long and workers that hang or die."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from worker.engine.eval.grading import Grader, Verdict, format_grader, last_boxed, pass_at_k

# The tests that share one grader share its event loop too.
in_module_loop = pytest.mark.asyncio(loop_scope="module")

# sympy keeps working on this one for minutes (9^387420489, evaluated).
SLOW_ANSWER = "9^{9^{9}}"

# (completion, reference answer, verdict): the answers a math model writes.
COMPLETIONS = [
    # fractions, and \frac against a decimal both ways
    (r"Half of the pie is left, so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}", Verdict.CORRECT),
    (r"So the probability is \boxed{0.5}.", r"\frac{1}{2}", Verdict.CORRECT),
    (r"Thus $x = \boxed{\dfrac{3}{4}}$.", "0.75", Verdict.CORRECT),
    (r"The ratio is \boxed{\frac{2}{4}}", r"\frac12", Verdict.CORRECT),
    (r"The answer is \boxed{\frac{1}{3}}.", r"\frac{1}{2}", Verdict.WRONG),
    (r"Rounded, \boxed{0.333}", r"\frac{1}{3}", Verdict.WRONG),
    # radicals in equivalent forms
    (r"The diagonal is \boxed{\sqrt{8}}.", r"2\sqrt{2}", Verdict.CORRECT),
    (r"Rationalising, \boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", Verdict.CORRECT),
    (r"The side is \boxed{2\sqrt{3}}.", r"2\sqrt{2}", Verdict.WRONG),
    # intervals compare as intervals: endpoints and their brackets
    (r"Hence $x \in \boxed{(0, 1]}$.", "(0,1]", Verdict.CORRECT),
    (r"\boxed{(-\infty,2)\cup(3,\infty)}", r"(-\infty, 2) \cup (3, \infty)", Verdict.CORRECT),
    (r"Hence $x \in \boxed{[0, 1]}$.", "(0, 1]", Verdict.WRONG),
    # plain numbers, sets, expressions, equations
    (r"In total \boxed{42} apples.", "42", Verdict.CORRECT),
    (r"There are \boxed{1,000} ways.", "1000", Verdict.CORRECT),
    (r"\boxed{41}", "42", Verdict.WRONG),
    (r"The roots are \boxed{\{3, 1, 2\}}", r"\{1, 2, 3\}", Verdict.CORRECT),
    (r"Factorising, \boxed{(x-1)(x+1)}", "x^2 - 1", Verdict.CORRECT),
    (r"Solving, \boxed{x = 3}", "3", Verdict.CORRECT),
    (r"The area is \boxed{\pi r^2}", r"2\pi r", Verdict.WRONG),
    # the last box counts, whatever came before; \fbox and an unbraced \boxed too
    (r"First I got \boxed{2}, but correcting the sign: \boxed{3}", "3", Verdict.CORRECT),
    (r"First I got \boxed{2}, but correcting the sign: \boxed{3}", "2", Verdict.WRONG),
    (r"Answer: \fbox{7}", "7", Verdict.CORRECT),
    (r"so the answer is $\boxed 7$", "7", Verdict.CORRECT),
    # no mathematical expression in the box
    (r"The answer is \boxed{\frac{3}{}}", "3", Verdict.UNPARSEABLE),
    (r"I am not sure: \boxed{}", "3", Verdict.UNPARSEABLE),
    # no complete box: none at all, or the completion was cut off inside the last one
    ("The answer is 5.", "5", Verdict.NO_ANSWER),
    (r"So the answer is \boxed{\frac{1}{2", r"\frac{1}{2}", Verdict.NO_ANSWER),
    (r"Maybe \boxed{2}. No wait, it is \boxed{\frac{3", "2", Verdict.NO_ANSWER),
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def grader() -> AsyncIterator[Grader]:
    async with Grader(workers=2) as shared:
        yield shared


def pool_processes(before: list[multiprocessing.Process]) -> list[multiprocessing.Process]:
    """The child processes started since `before` was taken: the grader's workers."""
    known = {process.pid for process in before}
    return [process for process in multiprocessing.active_children() if process.pid not in known]


@in_module_loop
@pytest.mark.parametrize(("completion", "reference", "verdict"), COMPLETIONS)
async def test_completion_is_graded_against_its_reference(
    grader: Grader, completion: str, reference: str, verdict: Verdict
) -> None:
    assert await grader.grade([(last_boxed(completion), reference)]) == [verdict]


@in_module_loop
async def test_a_batch_keeps_its_order(grader: Grader) -> None:
    pairs = [(last_boxed(completion), reference) for completion, reference, _ in COMPLETIONS]

    assert await grader.grade(pairs) == [verdict for _, _, verdict in COMPLETIONS]


@in_module_loop
async def test_grade_answers_says_which_completions_hold_their_reference(grader: Grader) -> None:
    completions = [r"So \boxed{0.5}.", "It is 1.", r"\boxed{3}", r"cut off \boxed{\frac{1}{"]
    references = [r"\frac{1}{2}", "1", "4", r"\frac{1}{2}"]

    assert await grader.grade_answers(completions, references) == [True, False, False, False]
    with pytest.raises(ValueError):
        await grader.grade_answers(completions, references[:2])


def test_last_boxed_reads_nested_and_escaped_braces() -> None:
    assert last_boxed(r"\boxed{\frac{\sqrt{2}}{2}}") == r"\frac{\sqrt{2}}{2}"
    assert last_boxed(r"\boxed{\left\{ 1, 2 \right.}") == r"\left\{ 1, 2 \right."
    assert last_boxed(r"\boxed{\{1,2\}} and \boxed { 5 }") == "5"
    assert last_boxed(r"\boxed{a} then \fbox{b}") == "b"
    assert last_boxed(r"$\boxed 12$ apples") == "12"


def test_last_boxed_finds_nothing_without_a_complete_last_box() -> None:
    assert last_boxed("no box here, just 5") is None
    assert last_boxed(r"\boxedsymbol{5} is another command") is None
    assert last_boxed(r"\boxed{5} then cut off \boxed{\frac{1}{") is None
    assert last_boxed(r"ends with \boxed") is None


async def test_slow_answers_time_out_in_their_worker_and_the_next_ones_still_grade() -> None:
    before = multiprocessing.active_children()
    async with Grader(workers=1, timeout_s=0.5, kill_after_s=1.0) as grader:
        assert await grader.grade([("5", "5")]) == [Verdict.CORRECT]
        [worker] = pool_processes(before)
        # Sent all at once, the last two would wait 3 s in the pool's queue, past an answer's
        # deadline (2 * timeout_s + kill_after_s): answers go to the pool as workers free up.
        pairs = [(SLOW_ANSWER, "5")] * 6 + [("5", "5"), (r"\frac{1}{2}", "0.5")]

        verdicts = await grader.grade(pairs)

        assert verdicts == [Verdict.TIMEOUT] * 6 + [Verdict.CORRECT] * 2
        # The worker's own alarm stopped each slow answer: nobody had to kill it.
        assert pool_processes(before) == [worker]
        assert worker.is_alive()


async def test_starting_the_pool_does_not_count_against_the_first_answers() -> None:
    # Starting two workers (Python, sympy) takes longer than the 0.75 s these answers get.
    async with Grader(workers=2, timeout_s=0.25, kill_after_s=0.25) as grader:
        assert await grader.grade([("1", "1"), ("2", "2")]) == [Verdict.CORRECT] * 2


async def test_a_hung_worker_is_killed_and_replaced() -> None:
    before = multiprocessing.active_children()
    async with Grader(workers=1, timeout_s=0.5, kill_after_s=1.0) as grader:
        assert await grader.grade([("5", "5")]) == [Verdict.CORRECT]
        [worker] = pool_processes(before)
        os.kill(worker.pid, signal.SIGSTOP)  # stuck where no alarm gets through

        assert await grader.grade([("5", "5")]) == [Verdict.TIMEOUT]
        assert await grader.grade([("5", "5"), ("6", "5")]) == [Verdict.CORRECT, Verdict.WRONG]
        worker.join(5.0)
        assert not worker.is_alive()
        assert [process.pid for process in pool_processes(before)] != [worker.pid]


async def test_a_dead_worker_is_replaced_and_no_answer_is_lost() -> None:
    before = multiprocessing.active_children()
    async with Grader(workers=2) as grader:
        assert await grader.grade([("5", "5")]) == [Verdict.CORRECT]
        first = pool_processes(before)[0]
        first.kill()
        first.join(5.0)

        verdicts = await grader.grade([(str(n), "3") for n in range(6)])

        assert verdicts == [Verdict.CORRECT if n == 3 else Verdict.WRONG for n in range(6)]


async def test_closing_stops_every_worker() -> None:
    before = multiprocessing.active_children()
    async with Grader(workers=2) as grader:
        await grader.grade([("1", "1"), ("2", "2")])
        workers = pool_processes(before)
        assert len(workers) == 2

    for worker in workers:
        worker.join(5.0)
        assert not worker.is_alive()


async def test_answers_without_a_box_never_start_the_pool() -> None:
    before = multiprocessing.active_children()
    async with Grader(workers=1) as grader:
        assert await grader.grade([(None, "1"), (None, "2")]) == [Verdict.NO_ANSWER] * 2
        assert pool_processes(before) == []


@in_module_loop
async def test_concurrent_batches_share_the_pool(grader: Grader) -> None:
    first, second = await asyncio.gather(
        grader.grade([("1", "1"), ("2", "3")]), grader.grade([(r"\sqrt{4}", "2")])
    )

    assert first == [Verdict.CORRECT, Verdict.WRONG]
    assert second == [Verdict.CORRECT]


def test_pass_at_k_matches_hand_computed_values() -> None:
    # n=2, c=1: one draw finds the correct sample half the time; two draws always do.
    assert pass_at_k([[True, False]], 1) == pytest.approx(0.5)
    assert pass_at_k([[True, False]], 2) == pytest.approx(1.0)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
    assert pass_at_k([[True, True, False, False, False]], 2) == pytest.approx(0.7)
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252.
    assert pass_at_k([[True] * 3 + [False] * 7], 5) == pytest.approx(1 - 21 / 252)
    # averaged over prompts: (0.5 + 0 + 1) / 3
    assert pass_at_k([[True, False], [False, False], [True, True]], 1) == pytest.approx(0.5)
    # large n stays finite: 1 correct of 1000, one draw
    assert pass_at_k([[True] + [False] * 999], 1) == pytest.approx(0.001)


def test_pass_at_k_refuses_what_it_cannot_estimate() -> None:
    with pytest.raises(ValueError, match="at least 3 samples"):
        pass_at_k([[True, False]], 3)
    with pytest.raises(ValueError, match="at least 1"):
        pass_at_k([[True]], 0)
    with pytest.raises(ValueError, match="at least one prompt"):
        pass_at_k([], 1)


async def test_a_format_grader_accepts_what_the_pattern_matches_whole_once_stripped():
    grade = format_grader(r"-?[0-9]+")
    answers = ["7", "  -12\n", "7.", "The answer is 7", "", "7 8"]

    assert await grade(answers, [""] * len(answers)) == [True, True, False, False, False, False]


async def test_a_format_grader_fails_an_answer_its_pattern_backtracks_on_without_end():
    """(a+)+b on a long run of a's takes exponential time: the answer fails, the grading
    finishes."""
    grade = format_grader(r"(a+)+b")

    assert await grade(["a" * 64, "aab"], ["", ""]) == [False, True]
