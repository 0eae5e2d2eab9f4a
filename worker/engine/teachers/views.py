"""The teachers as a run scores with them: each one's client, and how it renders a prompt.

A teacher whose chat template is the student's reads the student's prompt itself, so its
requests are those of a run that never heard of templates. One with its own template reads
the prompt (a question, or a conversation with its tools) as that template renders it,
then the student's completion tokens: its
input is `teacher_prompt + completion`, the completion's logprobs from len(teacher_prompt)
on (the preflight has checked that the two tokenizers agree on every token). One with
another tokenizer reads its own rendering, then the completion's text as its own tokens
(`cross_tokenizer.Retokenized`). A teacher on an inference server (`server_view`) is in one
of these modes too, and reads the same tokens over HTTP. A self teacher (`self_view`) is
the student's own model reading its own rendering too: a context the student does not see
(a system line, example turns: where the template puts a system line; the reference answer
after the last user turn); with the student's rollouts on vLLM it scores there too (the
served base model, or each completion's adapter).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from jinja2 import TemplateError

from kernel.chats.conversation import ChatMessage, Conversation
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
from worker.engine.data.prompts import Prompt, as_chat, prompt_key, prompt_text, render
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
FEEDBACK_LINE = "Feedback: "
"""What a self teacher with `context: feedback` reads after the question, then the
feedback given on the row's served answer."""
SYSTEM_ROLES = ("system", "developer")


def in_context(
    chat: Conversation, context: SelfTeacher, answer: str | None, feedback: str | None = None
) -> Conversation:
    """The chat a self teacher reads: its context where the template puts a system line
    (its system line after the chat's own, if the chat has one, then its example turns),
    then the chat, the reference answer after its last user turn if it reads one, and the
    feedback given on the row if it reads that."""
    messages = list(chat.messages)
    system = messages.pop(0) if messages and messages[0].role in SYSTEM_ROLES else None
    lines = [text for text in (system and system.text(), context.system) if text]
    head = [ChatMessage(role="system", content="\n\n".join(lines))] if lines else []
    for example in context.examples:
        head += [
            ChatMessage(role="user", content=example.user),
            ChatMessage(role="assistant", content=example.assistant),
        ]
    if context.reference or context.context == "feedback":
        last = max(i for i, message in enumerate(messages) if message.role == "user")
        text = messages[last].text()
        if context.reference:
            text = referenced(text, answer)
        if context.context == "feedback":
            text = f"{text}\n\n{FEEDBACK_LINE}{feedback}"
        messages[last] = messages[last].model_copy(update={"content": text})
    return Conversation.model_construct(messages=[*head, *messages], tools=chat.tools)


def referenced(content: str, answer: str | None) -> str:
    """A user turn as a self teacher that reads reference answers reads it: the answer
    after it (and then one must be given)."""
    if answer is None:
        raise OPDError(
            f"the self teacher reads each prompt's reference answer, and {content[:80]!r} has none",
            code="bad_dataset",
        )
    return f"{content}\n\n{REFERENCE_LINE}{answer}"


@dataclass
class Renderer:
    """A tokenizer's chat template rendering prompts as tokens (after a self teacher's
    context, `context`), those rendered recently kept: each step renders its own, again
    for its samples, and every eval the same ones."""

    tokenizer: Any
    context: SelfTeacher | None = None
    rendered: dict[tuple[Any, str, bool, str | None], list[int]] = field(default_factory=dict)
    feedback: dict[Any, str] = field(default_factory=dict)
    """The feedback on each prompt (by `prompt_key`) a self teacher with `context:
    feedback` reads."""

    def __call__(
        self, prompt: Prompt, options: PromptOptions, answer: str | None = None
    ) -> list[int]:
        """`answer`: the reference answer, read by a self teacher with `reference: true`."""
        context = self.context
        reference = answer if context is not None and context.reference else None
        key = (prompt_key(prompt), options.question_suffix, options.enable_thinking, reference)
        if key not in self.rendered:
            if len(self.rendered) >= RENDERED_KEPT:
                self.rendered.clear()
            if context is None:
                self.rendered[key] = render(self.tokenizer, prompt, options)
            else:
                chat = in_context(as_chat(prompt, options), context, reference, self.said(prompt))
                self.rendered[key] = render(self.tokenizer, chat, options)
        return self.rendered[key]

    def said(self, prompt: Prompt) -> str | None:
        """The feedback on `prompt`, when the context reads it (one it has none for: an
        error, as a reference answer missing is)."""
        if self.context is None or self.context.context != "feedback":
            return None
        if (said := self.feedback.get(prompt_key(prompt))) is None:
            raise OPDError(
                "the self teacher reads each prompt's feedback, and "
                f"{prompt_text(prompt)[:80]!r} has none",
                code="bad_dataset",
            )
        return said


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
        prompt: Prompt,
        options: PromptOptions,
        student_prompt: list[int],
        answer: str | None = None,
    ) -> list[int]:
        """The tokens this teacher reads before a completion of `prompt` (whose reference
        answer a self teacher may read)."""
        return student_prompt if self.own is None else self.own(prompt, options, answer)

    def client_for(self, sampler: SamplingClient | None) -> SamplingClient:
        """What scores with this teacher the completions `sampler` sampled."""
        if self.client is not None:
            return self.client
        assert sampler is not None, f"teacher {self.name!r} scores with the completion's sampler"
        return sampler

    def prompted(
        self,
        prompt: Prompt,
        options: PromptOptions,
        student_prompt: list[int],
        answer: str | None = None,
        sampler: SamplingClient | None = None,
    ) -> Scorer:
        """This teacher, ready to score the completions of `prompt` that `sampler`
        sampled."""
        tokens = self.prompt(prompt, options, student_prompt, answer)
        client = self.client_for(sampler)
        if self.tokenizers is not None:
            return Retokenized(self.name, client, tokens, self.tokenizers)
        return Prompted(self.name, client, tokens)

    def answerer(
        self,
        prompt: Prompt,
        options: PromptOptions,
        student_prompt: list[int],
        answer: str | None = None,
        sampler: SamplingClient | None = None,
    ) -> Answerer:
        """This teacher answering `prompt` in its own tokens (a self teacher of `current`
        weights with `sampler`'s)."""
        tokens = self.prompt(prompt, options, student_prompt, answer)
        scorer = Prompted(self.name, self.client_for(sampler), tokens)
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
        if context.context == "feedback":
            if pool.prompts.feedback is None:
                raise OPDError(
                    f"{who} reads the feedback given on stored completions, and dataset "
                    f"{pool.name!r} is not a dataset of them (source: stored_completions)",
                    code="bad_dataset",
                )
            for prompt, said in zip(pool.prompts.prompts, pool.prompts.feedback, strict=True):
                if said is not None:
                    renderer.feedback[prompt_key(prompt)] = said
        if context.reference and None in answers:
            raise OPDError(
                f"{who} reads each prompt's reference answer, and dataset {pool.name!r} has "
                "prompts without one",
                code="bad_dataset",
            )
        checked = zip(pool.prompts.prompts[:PROMPTS_CHECKED], answers, strict=False)
        for prompt, answer in checked:
            try:
                renderer(prompt, pool.options, answer)
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
    checked: Sequence[tuple[Prompt, PromptOptions]],
    warn: Warn,
    stop: list[str],
    key: ServerKey | None = None,
    replicas: Sequence[str] = (),
) -> TeacherView:
    """Teacher `name` on its inference server, in the mode the preflight finds its
    tokenizer in (the student's, or the one `server.tokenizer` names), once a probe found
    that the server gives each token id of a prompt that tokenizer's text; `stop`: the
    student's stop strings (a cross-tokenizer teacher's completions end there); `key`: the
    one the operator bound to the server (None = none); `replicas`: the servers behind it."""
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
    client = ServerTeacher(server, tokenizer, field=field, warn=warn, key=key, replicas=replicas)
    view = TeacherView(
        name,
        client,
        None if mode == "same" else Renderer(tokenizer),
        Tokenizers.of(student, tokenizer, stop, served_top_k(server)) if mode == "cross" else None,
        server.url,
    )
    prompt, options = checked[0] if checked else (PROBE_QUESTION, PromptOptions())
    probe = view.prompt(prompt, options, render(student, prompt, options))
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
