"""Before step 0: can every teacher score the student's tokens as the student means them?

A teacher reads the student's completion tokens, so the two must agree on what each id is
(the whole token -> id map, not only its size; a model's padding rows beyond its tokenizer
never occur), and on the end-of-sequence and special tokens. Any difference fails the job
at once (`incompatible_models`), naming the teacher and the first token that differs.

The chat templates may differ: a teacher whose template renders the run's prompts
otherwise reads the prompt as its own template renders it, then the student's completion
(`teachers.TeacherView`). The local backend's logit-level objectives cannot use such a
teacher (`check_objective`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel.errors import IncompatibleModels
from kernel.spec import JobSpec, PromptOptions
from worker.engine.datums import build_prompt

PROMPTS_CHECKED = 2
"""Prompts of each dataset rendered by both tokenizers."""


def check_compatible(
    student: Any,
    teacher: Any,
    student_model: str,
    who: str,
    prompts: Sequence[tuple[str, PromptOptions]],
) -> bool:
    """Refuse a teacher (`who` names it and its model) whose tokenizer differs from the
    student's in a way that changes what it scores; return whether its chat template is
    the student's (else it renders the prompts its own way: `prompts` differ, or its
    template is another that may render other prompts differently)."""
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
    # Both render every prompt checked, so a template that cannot render fails here.
    alike = [
        build_prompt(student, question, options.question_suffix, options.enable_thinking)
        == build_prompt(teacher, question, options.question_suffix, options.enable_thinking)
        for question, options in prompts
    ]
    return all(alike) and student.chat_template == teacher.chat_template


def check_objective(spec: JobSpec, who: str) -> None:
    """Refuse a teacher with its own chat template where the trainer reads the teacher
    itself: the local backend's logit-level objectives compare the two distributions at
    the positions of the student's datum, which such a teacher's prompt shifts."""
    if spec.trainer_scores():
        raise IncompatibleModels(
            f"{who} renders the prompts with its own chat template, and objective "
            f"{spec.loop.objective.kind} on the local backend reads the teacher at the "
            "positions of the student's prompt and completion: use objective "
            "sampled_reverse_kl, or a teacher with the student's chat template"
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
