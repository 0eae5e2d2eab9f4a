"""Before step 0: can every teacher score the student's tokens as the student means them?

A teacher reads the student's token ids, so the two must agree on what each id is (the
whole token -> id map, not only its size; a model's padding rows beyond its tokenizer
never occur), on the end-of-sequence and special tokens, and on how the chat template
renders the run's prompts. Any difference fails the job at once (`incompatible_models`),
naming the teacher and the first token or position that differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel.errors import IncompatibleModels
from kernel.spec import PromptOptions
from worker.engine.datums import build_prompt

PROMPTS_CHECKED = 2
"""Prompts of each dataset rendered by both tokenizers."""


def check_compatible(
    student: Any,
    teacher: Any,
    student_model: str,
    who: str,
    prompts: Sequence[tuple[str, PromptOptions]],
) -> None:
    """Refuse a teacher (`who` names it and its model) whose tokenizer differs from the
    student's in a way that changes what it scores."""
    first = first_vocab_difference(student.get_vocab(), teacher.get_vocab())
    if first is not None:
        raise IncompatibleModels(
            f"student {student_model!r} and {who} map tokens differently: {first}; OPD needs "
            "a teacher that shares the student's tokenizer"
        )
    for name in ("eos_token", "eos_token_id"):
        if getattr(student, name) != getattr(teacher, name):
            raise IncompatibleModels(
                f"{who} has another {name}: {getattr(teacher, name)!r}, the student's is "
                f"{getattr(student, name)!r}"
            )
    ours, theirs = sorted(student.all_special_tokens), sorted(teacher.all_special_tokens)
    if ours != theirs:
        differing = sorted(set(ours) ^ set(theirs))[0]
        owner = "the teacher" if differing in theirs else "the student"
        raise IncompatibleModels(f"{who} has other special tokens: {differing!r} is only {owner}'s")
    for question, options in prompts:
        mine = build_prompt(student, question, options.question_suffix, options.enable_thinking)
        other = build_prompt(teacher, question, options.question_suffix, options.enable_thinking)
        if mine != other:
            at = next(
                (i for i, (a, b) in enumerate(zip(mine, other, strict=False)) if a != b),
                min(len(mine), len(other)),
            )
            raise IncompatibleModels(
                f"{who}'s chat template renders {question[:60]!r} differently: at position "
                f"{at} the student has {token_at(mine, at)} and the teacher {token_at(other, at)}"
            )


def first_vocab_difference(student: dict[str, int], teacher: dict[str, int]) -> str | None:
    """The first id (lowest) that the two maps disagree about, in words; None if equal."""
    if student == teacher:
        return None
    by_id = {index: token for token, index in student.items()}
    their_by_id = {index: token for token, index in teacher.items()}
    index = min(i for i in by_id.keys() | their_by_id.keys() if by_id.get(i) != their_by_id.get(i))
    return (
        f"id {index} is {by_id.get(index)!r} for the student and {their_by_id.get(index)!r} "
        f"for the teacher ({len(student)} vs {len(teacher)} tokens)"
    )


def token_at(tokens: list[int], position: int) -> str:
    return f"id {tokens[position]}" if position < len(tokens) else "the end"
