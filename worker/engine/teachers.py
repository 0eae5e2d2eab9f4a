"""The teachers as a run scores with them: each one's client, and how it renders a question.

A teacher whose chat template is the student's reads the student's prompt itself, so its
requests are those of a run that never heard of templates. One with its own template reads
the question as that template renders it, then the student's completion tokens: its
input is `teacher_prompt + completion`, the completion's logprobs from len(teacher_prompt)
on (the preflight has checked that the two tokenizers agree on every token). A teacher
on an inference server (`server_view`) reads the same tokens over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel.errors import IncompatibleModels
from kernel.spec import JobSpec, PromptOptions
from worker.engine.backends.contract import SamplingClient, ServiceClient
from worker.engine.backends.resilient import Warn
from worker.engine.backends.server import ServerTeacher
from worker.engine.datums import build_prompt
from worker.engine.preflight import check_compatible, check_objective
from worker.engine.rollouts import Prompted

RENDERED_KEPT = 4096
PROBE_QUESTION = "What is 12 + 30?"
"""The question a server teacher's probe renders when the run has no prompts to check."""


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
    server: str | None = None
    """The URL of the inference server it is on; None: a model the backend loads."""

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
        served = "" if self.server is None else f"server {self.server}, "
        return (
            served
            + "same tokenizer, "
            + ("same chat template" if self.own is None else "its own chat template")
        )

    async def aclose(self) -> None:
        """Close what the client holds open (a server teacher's connections)."""
        if isinstance(self.client, ServerTeacher):
            await self.client.aclose()


async def server_view(
    spec: JobSpec,
    name: str,
    service: ServiceClient,
    student: Any,
    checked: Sequence[tuple[str, PromptOptions]],
    warn: Warn,
) -> TeacherView:
    """Teacher `name` on its inference server, once the preflight found it reads the
    student's tokens: its tokenizer (the student's, or the one `server.tokenizer` names,
    which must agree with the student's as a loaded teacher's must) gives each token id
    of a probe prompt the text the server gives it."""
    teacher = spec.teacher_specs()[name]
    server = teacher.server
    assert server is not None
    who = f"{spec.teacher_field(name)} ({server.url}, model {server.model!r})"
    tokenizer, alike = student, True
    if server.tokenizer not in (None, spec.student.base_model):
        named = await service.create_sampling_client_async(base_model=server.tokenizer)
        tokenizer = await asyncio.to_thread(named.get_tokenizer)
        alike = check_compatible(student, tokenizer, spec.student.base_model, who, checked)
        if not alike:
            check_objective(spec, who)
    client = ServerTeacher(server, tokenizer, field=f"{spec.teacher_field(name)}.server", warn=warn)
    view = TeacherView(name, client, None if alike else Renderer(tokenizer), server.url)
    question, options = checked[0] if checked else (PROBE_QUESTION, PromptOptions())
    rendered = build_prompt(student, question, options.question_suffix, options.enable_thinking)
    probe = view.prompt(question, options, rendered)
    try:
        if (difference := await client.probe(probe)) is not None:
            raise IncompatibleModels(
                f"{who} reads token ids otherwise than the tokenizer of "
                f"{server.tokenizer or spec.student.base_model!r}: {difference}; name the "
                "server model's tokenizer in server.tokenizer"
            )
    except BaseException:
        await client.aclose()
        raise
    return view
