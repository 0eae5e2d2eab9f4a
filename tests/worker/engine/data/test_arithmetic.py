"""The `arithmetic` dataset source: generated problems, their answers, and a held-out split."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.errors import OPDError
from kernel.spec import ArithmeticDataset, SpecError, parse_spec
from tests.support import named
from worker.engine.data.arithmetic import held_out_problems, nth_problem, training_problems
from worker.engine.data.datasets import load_holdout, load_prompts


def test_every_problem_of_an_operation_is_listed_once_with_its_answer() -> None:
    dataset = ArithmeticDataset(digits=1, multiplier_digits=1)
    for op in ("add", "sub", "mul"):
        problems = {nth_problem(dataset, op, i) for i in range(dataset.problem_count(op))}
        assert len(problems) == dataset.problem_count(op)
        assert {(p.left, p.right) for p in problems} == {
            (a, b) for a in range(10) for b in range(10) if op != "sub" or a >= b
        }
        for problem in problems:
            symbol = {"add": "+", "sub": "-", "mul": "*"}[op]
            assert problem.question == f"What is {problem.left} {symbol} {problem.right}?"
            assert int(problem.answer) == eval(f"{problem.left} {symbol} {problem.right}")


def test_operands_have_the_digits_asked_for() -> None:
    dataset = ArithmeticDataset(digits=2, multiplier_digits=1, count=300)
    problems = training_problems(dataset)
    assert [dataset.problem_count(op) for op in ("add", "sub", "mul")] == [8100, 4095, 900]
    assert all(10 <= p.left <= 99 for p in problems)
    assert all(10 <= p.right <= 99 for p in problems if p.op != "mul")
    assert all(0 <= p.right <= 9 for p in problems if p.op == "mul")
    assert all(p.left >= p.right for p in problems if p.op == "sub")


def test_the_pool_is_seeded_and_mixes_the_operations_evenly() -> None:
    dataset = ArithmeticDataset(digits=2, count=300, seed=3)
    pool = training_problems(dataset)
    assert pool == training_problems(dataset)
    assert pool != training_problems(ArithmeticDataset(digits=2, count=300, seed=4))
    assert [p.op for p in pool[:6]] == ["add", "sub", "mul", "add", "sub", "mul"]
    assert len(set(pool)) == 300
    everything = training_problems(ArithmeticDataset(count=1000))
    assert len(everything) == len(set(everything)) == 100 + 55 + 100  # none repeats


def test_held_out_prompts_never_meet_the_pool_and_carry_answers(tmp_path: Path) -> None:
    dataset = ArithmeticDataset(ops=["add", "mul"], digits=1, count=150, seed=5)

    pool = load_prompts(dataset, tmp_path, True)
    held_out = load_holdout(dataset, 40, 2, tmp_path, True)

    assert len(pool) == 150 and len(held_out) == 40
    assert not set(pool.prompts) & set(held_out.prompts)
    assert held_out == load_holdout(dataset, 40, 2, tmp_path, True)
    assert held_out != load_holdout(dataset, 40, 3, tmp_path, True)
    by_question = {p.question: p.answer for p in held_out_problems(dataset, 40, 2)}
    assert dict(zip(held_out.prompts, held_out.answers, strict=True)) == by_question
    with pytest.raises(OPDError, match="leave 50 outside the training pool") as caught:
        load_holdout(dataset, 51, 2, tmp_path, True)
    assert caught.value.code == "bad_eval"


def test_the_spec_names_the_source_and_checks_its_options() -> None:
    spec = parse_spec(named({"dataset": {"source": "arithmetic", "ops": ["mul"], "count": 10}}))
    assert isinstance(spec.dataset, ArithmeticDataset)
    assert "\\boxed{}" in spec.dataset.question_suffix
    for bad, field in (
        ({"ops": ["div"]}, "dataset.ops.0"),
        ({"ops": []}, "dataset.ops"),
        ({"ops": ["add", "add"]}, "dataset.ops"),
        ({"digits": 4}, "dataset.digits"),
        ({"count": 0}, "dataset.count"),
    ):
        with pytest.raises(SpecError) as caught:
            parse_spec(named({"dataset": {"source": "arithmetic", **bad}}))
        assert field in [path for path, _ in caught.value.problems], caught.value.problems
