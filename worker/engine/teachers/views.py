"""The teachers as a run scores with them: each one's client, and how it renders a question.

A teacher whose chat template is the student's reads the student's prompt itself, so its
requests are those of a run that never heard of templates. One with its own template reads
the question as that template renders it, then the student's completion tokens: its
input is `teacher_prompt + completion`, the completion's logprobs from len(teacher_prompt)
on (the preflight has checked that the two tokenizers agree on every token). One with
another tokenizer reads its own rendering, then the completion's text as its own tokens
(`cross_tokenizer.Retokenized`). A teacher on an inference server (`server_view`) is in one
of these modes too, and reads the same tokens over HTTP. A self teacher (`self_view`) is
the student's own model reading its own rendering too: a context the student does not see
(a system line, example turns, the reference answer) before the question; with the student's
rollouts on vLLM it scores there too (the served base model, or each completion's adapter).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from jinja2 import TemplateError

from kernel.errors import IncompatibleModels, OPDError
from kernel.spec import JobSpec, PromptOptions, TeacherServer
from kernel.spec.teachers import SelfTeacher
from worker.engine.backends.contract import (
    SamplingClient,
    SelfTeachingClient,
    ServiceClient,
    TrainingClient,
)
from worker.engine.backends.resilient import Warn
from worker.engine.backends.server import ServerKey, ServerTeacher
from worker.engine.backends.vllm import VLLMSampler, VLLMServer
from worker.engine.data.mixing import Pool
from worker.engine.rollouts.datums import build_chat, build_prompt, question_text
from worker.engine.rollouts.sampling import Scorer
from worker.engine.teachers.cross_tokenizer import Retokenized, Tokenizers
from worker.engine.teachers.preflight import (
    MODE_WORDS,
    PROMPTS_CHECKED,
    Mode,
    check_objective,
    teacher_mode,
)
from worker.engine.teachers.scoring import Prompted

RENDERED_KEPT = 4096
PROBE_QUESTION = "What is 12 + 30?"
"""The question a server teacher's probe renders when the run has no prompts to check."""


REFERENCE_LINE = "Reference answer: "
"""What a self teacher with `reference: true` reads after the question, then the answer."""


def self_messages(
    context: SelfTeacher, question: str, options: PromptOptions, answer: str | None
) -> list[dict[str, str]]:
    """The chat a self teacher reads: its context's turns, then the question as the
    student reads it, followed by the reference answer if it reads one."""
    content = question_text(question, options.question_suffix)
    return [
        *context_turns(context),
        {"role": "user", "content": referenced(context, content, answer)},
    ]


def context_turns(context: SelfTeacher) -> list[dict[str, str]]:
    """A self teacher's system line and example turns, as chat messages."""
    turns = [] if context.system is None else [{"role": "system", "content": context.system}]
    for example in context.examples:
        turns += [
            {"role": "user", "content": example.user},
            {"role": "assistant", "content": example.assistant},
        ]
    return turns


def referenced(context: SelfTeacher, content: str, answer: str | None) -> str:
    """A user turn as a self teacher reads it: with the reference answer after it, if it
    reads one (and then one must be given)."""
    if not context.reference:
        return content
    if answer is None:
        raise OPDError(
            f"the self teacher reads each prompt's reference answer, and {content[:80]!r} has none",
            code="bad_dataset",
        )
    return f"{content}\n\n{REFERENCE_LINE}{answer}"


@dataclass
class Renderer:
    """A tokenizer's chat template rendering questions as prompt tokens (after a self
    teacher's context, `context`), those rendered recently kept: each step renders its
    own, again for its samples, and every eval the same ones."""

    tokenizer: Any
    context: SelfTeacher | None = None
    rendered: dict[tuple[str, str, bool, str | None], list[int]] = field(default_factory=dict)

    def __call__(
        self, question: str, options: PromptOptions, answer: str | None = None
    ) -> list[int]:
        """`answer`: the reference answer, read by a self teacher with `reference: true`."""
        context = self.context
        reference = answer if context is not None and context.reference else None
        key = (question, options.question_suffix, options.enable_thinking, reference)
        if key not in self.rendered:
            if len(self.rendered) >= RENDERED_KEPT:
                self.rendered.clear()
            if context is None:
                self.rendered[key] = build_prompt(
                    self.tokenizer, question, options.question_suffix, options.enable_thinking
                )
            else:
                messages = self_messages(context, question, options, reference)
                self.rendered[key] = build_chat(self.tokenizer, messages, options.enable_thinking)
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


SelfWeights = Literal["base", "current"]


@dataclass
class TeacherView:
    """One teacher: its name, its client, its mode (`preflight.Mode`) and, unless it reads
    the student's prompt, the renderer of its own template (`own`); with another tokenizer
    also both tokenizers as bytes (`tokenizers`); on an inference server, its URL; a self
    teacher, the student's weights it reads with (`weights`). A client of None is the
    sampler of the completions it scores: a self teacher of `current` weights."""

    name: str
    client: SamplingClient | None
    own: Renderer | None = None
    tokenizers: Tokenizers | None = None
    server: str | None = None
    weights: SelfWeights | None = None

    @property
    def mode(self) -> Mode:
        if self.weights is not None:
            return "self"
        return "cross" if self.tokenizers else "own" if self.own else "same"

    def prompt(
        self,
        question: str,
        options: PromptOptions,
        student_prompt: list[int],
        answer: str | None = None,
    ) -> list[int]:
        """The prompt this teacher reads before a completion of `question` (whose
        reference answer a self teacher may read)."""
        return student_prompt if self.own is None else self.own(question, options, answer)

    def client_for(self, sampler: SamplingClient | None) -> SamplingClient:
        """What scores with this teacher the completions `sampler` sampled."""
        if self.client is not None:
            return self.client
        assert sampler is not None, f"teacher {self.name!r} scores with the completion's sampler"
        return sampler

    def prompted(
        self,
        question: str,
        options: PromptOptions,
        student_prompt: list[int],
        answer: str | None = None,
        sampler: SamplingClient | None = None,
    ) -> Scorer:
        """This teacher, ready to score the completions of `question` that `sampler`
        sampled."""
        prompt = self.prompt(question, options, student_prompt, answer)
        client = self.client_for(sampler)
        if self.tokenizers is not None:
            return Retokenized(self.name, client, prompt, self.tokenizers)
        return Prompted(self.name, client, prompt)

    def answerer(
        self,
        question: str,
        options: PromptOptions,
        student_prompt: list[int],
        answer: str | None = None,
        sampler: SamplingClient | None = None,
    ) -> Answerer:
        """This teacher answering `question` in its own tokens (a self teacher of `current`
        weights with `sampler`'s)."""
        prompt = self.prompt(question, options, student_prompt, answer)
        scorer = Prompted(self.name, self.client_for(sampler), prompt)
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
        weights = "" if self.weights is None else f" ({SELF_WEIGHT_WORDS[self.weights]})"
        return served + MODE_WORDS[self.mode] + weights

    async def aclose(self) -> None:
        """Close what the client holds open (a server teacher's connections)."""
        if isinstance(self.client, ServerTeacher):
            await self.client.aclose()


SELF_WEIGHT_WORDS: dict[SelfWeights, str] = {
    "base": "its base weights, the adapter off",
    "current": "the weights that sampled each completion",
}


async def self_view(
    spec: JobSpec,
    name: str,
    service: ServiceClient,
    training: TrainingClient,
    tokenizer: Any,
    pools: Sequence[Pool],
    vllm: VLLMServer | None = None,
) -> TeacherView:
    """Teacher `name`, the student's own model reading its context, once the student's
    chat template rendered it before the first prompts of each pool it scores (and, if it
    reads reference answers, every prompt has one). `base` weights: with the student's
    rollouts on `vllm`, the base model that server serves; else on the local backend the
    training client's own model with its adapter off (no second copy), on a remote
    backend a sampler of the base model there; `current`: each completion's sampler (on
    `vllm`, that version's adapter there)."""
    context = spec.teacher_specs()[name].self
    assert context is not None
    who = f"{spec.teacher_field(name)}.self"
    renderer = Renderer(tokenizer, context)
    for pool in pools:
        if name not in pool.teachers:
            continue
        answers = pool.prompts.answers
        if context.reference and None in answers:
            raise OPDError(
                f"{who} reads each prompt's reference answer, and dataset {pool.name!r} has "
                "prompts without one",
                code="bad_dataset",
            )
        checked = zip(pool.prompts.questions[:PROMPTS_CHECKED], answers, strict=False)
        for question, answer in checked:
            try:
                renderer(question, pool.options, answer)
            except (ValueError, TemplateError) as error:
                raise IncompatibleModels(
                    f"the student's chat template cannot render {who}'s context: {error}"
                ) from error
    client: SamplingClient | None = None
    if context.weights == "base" and vllm is not None and not spec.trainer_scores():
        client = VLLMSampler(vllm, spec.student.base_model, tokenizer)
        return TeacherView(name, client, renderer, server=vllm.url, weights="base")
    if context.weights == "base" and spec.backend == "local":
        client = await cast(SelfTeachingClient, training).base_sampling_client_async()
    elif context.weights == "base":
        client = await service.create_sampling_client_async(base_model=spec.student.base_model)
    return TeacherView(name, client, renderer, weights=context.weights)


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
    key: ServerKey | None = None,
) -> TeacherView:
    """Teacher `name` on its inference server, in the mode the preflight finds its
    tokenizer in (the student's, or the one `server.tokenizer` names), once a probe found
    that the server gives each token id of a prompt that tokenizer's text; `stop`: the
    student's stop strings (a cross-tokenizer teacher's completions end there); `key`: the
    one the operator bound to the server (None = none)."""
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
    field = f"{spec.teacher_field(name)}.server"
    client = ServerTeacher(server, tokenizer, field=field, warn=warn, key=key)
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
