"""Before step 0: how does each teacher read the student's completions (`Mode`)?

A teacher that agrees with the student on what each id is (the whole token -> id map, not
only its size; a model's padding rows beyond its tokenizer never occur) and on the
end-of-sequence and special tokens reads the student's completion tokens themselves:
after the student's prompt when their chat templates agree, else after its own rendering
of the prompt (`teachers.TeacherView`). Any other teacher has another tokenizer: it reads
the completion's text as its own tokens, its logprobs aligned to the student's by byte
offsets (`cross_tokenizer`). The logit-level objectives need a shared vocabulary
(`check_objective`). The playground scores with a teacher in each mode as training does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from kernel.errors import IncompatibleModels
from kernel.spec import JobSpec, PromptOptions
from worker.engine.data.prompts import Prompt, render

PROMPTS_CHECKED = 2
"""Prompts of each dataset rendered by both tokenizers."""


Mode = Literal["same", "own", "cross", "self"]
"""How a teacher reads the student's completions: after the student's prompt (`same`: same
tokenizer and chat template), after its own rendering (`own`: same tokenizer, its own
template), as text re-tokenized by its own tokenizer (`cross`: another tokenizer), or as
the student's own model after a context of its own (`self`)."""
MODE_WORDS: dict[Mode, str] = {
    "same": "same tokenizer, same chat template",
    "own": "same tokenizer, its own chat template",
    "cross": "another tokenizer (cross-tokenizer: its logprobs aligned by byte offsets)",
    "self": "the student's own model reading a context of its own",
}


def tokenizer_difference(
    student: Any, teacher: Any, student_model: str = "", who: str = "the teacher"
) -> str | None:
    """How `teacher`'s tokenizer (`who` names it and its model) differs from the student's
    in a way that changes what the same ids mean, in words; None if it does not: the whole
    token -> id map, the end of sequence and the special tokens."""
    first = first_vocab_difference(student.get_vocab(), teacher.get_vocab())
    if first is not None:
        return f"student {student_model!r} and {who} map tokens differently: {first}"
    for name in ("eos_token", "eos_token_id"):
        if getattr(student, name) != getattr(teacher, name):
            return (
                f"{who} has another {name}: {getattr(teacher, name)!r}, the student's is "
                f"{getattr(student, name)!r}"
            )
    ours, theirs = sorted(student.all_special_tokens), sorted(teacher.all_special_tokens)
    if ours != theirs:
        differing = sorted(set(ours) ^ set(theirs))[0]
        owner = "the teacher" if differing in theirs else "the student"
        return f"{who} has other special tokens: {differing!r} is only {owner}'s"
    return None


def teacher_mode(
    student: Any, teacher: Any, prompts: Sequence[tuple[Prompt, PromptOptions]]
) -> Mode:
    """Which mode a teacher scores in (`Mode`): `cross` if its tokenizer differs in any
    way (`tokenizer_difference`), else `same` if its chat template is the student's and
    renders `prompts` to the same tokens, else `own`. Both render every prompt checked, so
    a template that cannot render fails here."""
    if tokenizer_difference(student, teacher) is not None:
        for prompt, options in prompts:
            render(teacher, prompt, options)
        return "cross"
    alike = [
        render(student, prompt, options) == render(teacher, prompt, options)
        for prompt, options in prompts
    ]
    return "same" if all(alike) and student.chat_template == teacher.chat_template else "own"


def check_objective(spec: JobSpec, who: str, mode: Mode) -> None:
    """Refuse a teacher that cannot serve the job's objective. A logit-level objective
    compares the two distributions position by position: with a teacher of another
    tokenizer, over the text's next byte, which only the local backend's trainer computes
    (it reads both models' logits) and only for one teacher a prompt (a mixture's teachers
    cut their tokens elsewhere). A teacher reading its own prompt (its own chat template, a
    self teacher's context) serves every objective: the trainer reads it at the
    completion's positions after that prompt."""
    kind = spec.loop.objective.kind
    if mode != "cross" or not spec.loop.objective.logit_level:
        return
    if not spec.trainer_scores():
        raise IncompatibleModels(
            f"{who} has another tokenizer, and objective {kind} on the {spec.backend} backend "
            "compares the student's and the teacher's distributions token by token, which "
            "needs a shared vocabulary: use objective sampled_reverse_kl (the sampled tokens' "
            "logprobs, aligned by byte offsets), a teacher with the student's tokenizer, or "
            "the local backend (which compares the next byte's distributions)"
        )
    if spec.teacher_mixture == "mixture" and len(spec.teacher_specs()) > 1:
        raise IncompatibleModels(
            f"{who} has another tokenizer, and objective {kind} compares it with the student "
            "over the next byte, which a mixture of teachers cannot share: use "
            "teacher_mixture: route, or objective sampled_reverse_kl"
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
