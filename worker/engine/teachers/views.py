"""The teachers as a run scores with them: each one's client, and how it renders a question.

A teacher whose chat template is the student's reads the student's prompt itself, so its
requests are those of a run that never heard of templates. One with its own template reads
the question as that template renders it, then the student's completion tokens: its
input is `teacher_prompt + completion`, the completion's logprobs from len(teacher_prompt)
on (the preflight has checked that the two tokenizers agree on every token). One with
another tokenizer reads its own rendering, then the completion's text as its own tokens
(`cross_tokenizer.Retokenized`). A teacher on an inference server (`server_view`) is in one
of these modes too, and reads the same tokens over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel.errors import IncompatibleModels
from kernel.spec import JobSpec, PromptOptions, TeacherServer
from worker.engine.backends.contract import SamplingClient, ServiceClient
from worker.engine.backends.resilient import Warn
from worker.engine.backends.server import ServerTeacher
from worker.engine.rollouts.datums import build_prompt
from worker.engine.rollouts.sampling import Scorer
from worker.engine.teachers.cross_tokenizer import Retokenized, Tokenizers
from worker.engine.teachers.preflight import MODE_WORDS, Mode, check_objective, teacher_mode
from worker.engine.teachers.scoring import Prompted

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


@dataclass(frozen=True)
class Answerer:
    """A teacher answering a prompt for the eval's baseline, from its own rendering: it
    scores its own answer's tokens (`scorer`); with another tokenizer than the student's
    its answers are decoded with its own (`decode`) and stop at its own end of sequence
    (`stop`). None: the student's."""

    scorer: Prompted
    decode: Callable[[list[int]], str] | None = None
    stop: list[str] | None = None


@dataclass
class TeacherView:
    """One teacher: its name, its client, its mode (`preflight.Mode`) and, unless it reads
    the student's prompt, the renderer of its own template (`own`); with another tokenizer
    also both tokenizers as bytes (`tokenizers`); on an inference server, its URL."""

    name: str
    client: SamplingClient
    own: Renderer | None = None
    tokenizers: Tokenizers | None = None
    server: str | None = None

    @property
    def mode(self) -> Mode:
        return "cross" if self.tokenizers else "own" if self.own else "same"

    def prompt(self, question: str, options: PromptOptions, student_prompt: list[int]) -> list[int]:
        """The prompt this teacher reads before a completion of `question`."""
        return student_prompt if self.own is None else self.own(question, options)

    def prompted(self, question: str, options: PromptOptions, student_prompt: list[int]) -> Scorer:
        """This teacher, ready to score the completions of `question`."""
        prompt = self.prompt(question, options, student_prompt)
        if self.tokenizers is not None:
            return Retokenized(self.name, self.client, prompt, self.tokenizers)
        return Prompted(self.name, self.client, prompt)

    def answerer(
        self, question: str, options: PromptOptions, student_prompt: list[int]
    ) -> Answerer:
        """This teacher answering `question` in its own tokens."""
        scorer = Prompted(self.name, self.client, self.prompt(question, options, student_prompt))
        if self.tokenizers is None:
            return Answerer(scorer)
        tokenizer = self.tokenizers.teacher.tokenizer
        return Answerer(
            scorer,
            lambda tokens: tokenizer.decode(tokens, skip_special_tokens=True),
            [tokenizer.eos_token],
        )

    @property
    def template(self) -> str:
        """Which case the preflight found, in words."""
        served = "" if self.server is None else f"server {self.server}, "
        return served + MODE_WORDS[self.mode]

    async def aclose(self) -> None:
        """Close what the client holds open (a server teacher's connections)."""
        if isinstance(self.client, ServerTeacher):
            await self.client.aclose()


SERVED_TOP_K = 20
"""The likeliest tokens a cross-tokenizer teacher server is asked for at each position:
vLLM's default `--max-logprobs` (more is refused unless its operator raised it)."""


def served_top_k(server: TeacherServer) -> int:
    """SERVED_TOP_K where the server gives the top k by token id (`prompt_logprobs`), so a
    cross-tokenizer teacher on it is mapped by the chain rule on bytes; 0 under `echo`,
    whose top logprobs are keyed by text (the sampled logprobs' mapping)."""
    return SERVED_TOP_K if server.protocol == "prompt_logprobs" else 0


async def server_view(
    spec: JobSpec,
    name: str,
    service: ServiceClient,
    student: Any,
    checked: Sequence[tuple[str, PromptOptions]],
    warn: Warn,
    stop: list[str],
) -> TeacherView:
    """Teacher `name` on its inference server, in the mode the preflight finds its
    tokenizer in (the student's, or the one `server.tokenizer` names), once a probe found
    that the server gives each token id of a prompt that tokenizer's text; `stop`: the
    student's stop strings (a cross-tokenizer teacher's completions end there)."""
    teacher = spec.teacher_specs()[name]
    server = teacher.server
    assert server is not None
    who = f"{spec.teacher_field(name)} ({server.url}, model {server.model!r})"
    tokenizer = student
    mode: Mode = "same"
    if server.tokenizer not in (None, spec.student.base_model):
        named = await service.create_sampling_client_async(base_model=server.tokenizer)
        tokenizer = await asyncio.to_thread(named.get_tokenizer)
        mode = teacher_mode(student, tokenizer, checked)
    check_objective(spec, who, mode)
    client = ServerTeacher(server, tokenizer, field=f"{spec.teacher_field(name)}.server", warn=warn)
    view = TeacherView(
        name,
        client,
        None if mode == "same" else Renderer(tokenizer),
        Tokenizers.of(student, tokenizer, stop, served_top_k(server)) if mode == "cross" else None,
        server.url,
    )
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
