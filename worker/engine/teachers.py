"""The teachers as a run scores with them: each one's client, and how it renders a question.

A teacher whose chat template is the student's reads the student's prompt itself, so its
requests are those of a run that never heard of templates. One with its own template reads
the question as that template renders it, then the student's completion tokens: its
input is `teacher_prompt + completion`, the completion's logprobs from len(teacher_prompt)
on (the preflight has checked that the two tokenizers agree on every token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernel.spec import PromptOptions
from worker.engine.backends.contract import SamplingClient
from worker.engine.datums import build_prompt
from worker.engine.rollouts import Prompted

RENDERED_KEPT = 4096


@dataclass
class Renderer:
    """A tokenizer's chat template rendering questions as prompt tokens, those rendered
    recently kept: each step renders its own, again for its samples, and every eval the
    same ones."""

    tokenizer: Any
    rendered: dict[tuple[str, str, bool], list[int]] = field(default_factory=dict)

    def __call__(self, question: str, options: PromptOptions) -> list[int]:
        key = (question, options.question_suffix, options.enable_thinking)
        if key not in self.rendered:
            if len(self.rendered) >= RENDERED_KEPT:
                self.rendered.clear()
            self.rendered[key] = build_prompt(
                self.tokenizer, question, options.question_suffix, options.enable_thinking
            )
        return self.rendered[key]


@dataclass
class TeacherView:
    """One teacher: its name, its client and, when its chat template is not the student's,
    the renderer of its own template (`own`; None: it reads the student's prompt)."""

    name: str
    client: SamplingClient
    own: Renderer | None = None

    def prompt(self, question: str, options: PromptOptions, student_prompt: list[int]) -> list[int]:
        """The prompt this teacher reads before a completion of `question`."""
        return student_prompt if self.own is None else self.own(question, options)

    def prompted(
        self, question: str, options: PromptOptions, student_prompt: list[int]
    ) -> Prompted:
        """This teacher, ready to score the completions of `question`."""
        return Prompted(self.name, self.client, self.prompt(question, options, student_prompt))

    @property
    def template(self) -> str:
        """Which case the preflight found, in words."""
        return "same tokenizer, " + (
            "same chat template" if self.own is None else "its own chat template"
        )
