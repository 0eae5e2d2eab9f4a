"""The playground's messages: what a person asks of a checkpoint, the task the API hands a
worker through Redis, and the worker's answer (and the archive-fetching task's). One
definition for the API and the worker, so both sides of the queue read the same JSON."""

from __future__ import annotations

from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernel.chats.conversation import OPEN_ENDED, ChatMessage, Conversation, Tool
from kernel.spec import JobSpec, TeacherSpec
from kernel.spec.base import CheckpointRef, Name, SpecModel, field_error
from kernel.spec.data import MAX_PROMPT_CHARS
from kernel.spec.sampling import MAX_TOKENS
from kernel.wording import shown

T = TypeVar("T")

MAX_SAMPLES = 16
MAX_PLAYGROUND_TOKENS = 4096
MAX_MESSAGES = 64
MAX_TIMEOUT_SECONDS = 600.0
MAX_STOPS = 4
MAX_STOP_CHARS = 256
MAX_SEED = 2**63 - 1
MAX_TOP_LOGPROBS = 20
MAX_TOOLS = 128
ModelRole = Literal["checkpoint", "teacher", "base"]


class SampleRequest(SpecModel):
    """`POST /v1/jobs/{id}/sample`: one prompt, completed by a checkpoint (and, when asked,
    by the teacher and by the untrained student)."""

    model_config = ConfigDict(
        json_schema_extra={  # exactly one of the two, as the document states it
            "oneOf": [
                {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
                {"required": ["text"], "properties": {"text": {"type": "string"}}},
                {
                    "required": ["prompt_token_ids"],
                    "properties": {"prompt_token_ids": {"type": "array"}},
                },
            ]
        }
    )

    prompt: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROMPT_CHARS,
        description="A question, rendered as the job rendered its training prompts (its "
        "question_suffix and enable_thinking).",
    )
    messages: list[ChatMessage] | None = Field(
        None,
        min_length=1,
        max_length=MAX_MESSAGES,
        description="Or a chat in OpenAI's message format (tool calls and a tool's reply "
        "too), rendered by each model with its own tokenizer's chat template as training "
        "renders a conversation; the last message is the user's or a tool's.",
    )
    tools: list[Tool] | None = Field(
        None,
        max_length=MAX_TOOLS,
        description="With messages: the tools the chat may call, passed to each model's chat "
        "template (one that has no place for them leaves them out).",
    )
    text: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROMPT_CHARS,
        description="Or a text the models read as given, no template: tokenized by each "
        "model's own tokenizer with its special tokens, as vLLM's completions tokenize a prompt.",
    )
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_TOKENS,
        description="Or the prompt's token ids in the tokenizer of the model asked for, read "
        "as given (each below its vocabulary's size); a compared model with another tokenizer "
        "cannot read them.",
    )
    prompt_logprobs: bool = Field(
        False,
        description="Also each prompt token's logprob under each model (null for the first), "
        "from the prefill that scores a text (compute_logprobs, as the teacher scores).",
    )
    top_logprobs: int = Field(
        0,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Also the k likeliest tokens at each sampled token and, with "
        "prompt_logprobs, at each prompt token (then from the same prefill as its logprobs); "
        "a sampled token's from a prefill of the prompt and its completion.",
    )
    checkpoint: CheckpointRef = Field(
        "final", description="`final` or the step of saved sampler weights."
    )
    model: ModelRole = Field(
        "checkpoint",
        description="The model that completes the prompt: the `checkpoint`, the `teacher`, "
        "or the untrained student (`base`); `compare` adds others.",
    )
    n: int = Field(1, ge=1, le=MAX_SAMPLES, description="Completions per model.")
    max_tokens: int = Field(
        256,
        ge=0,
        le=MAX_PLAYGROUND_TOKENS,
        description="0 (only with prompt_logprobs): nothing sampled.",
    )
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]] = Field(
        default_factory=list,
        max_length=MAX_STOPS,
        description="Strings that end a completion: its text ends before the first one "
        "(its tokens end with the token that completed it).",
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="The sampler's seed, passed to the backend (the local backend mixes it "
        "with the sampler's request count: a cached sampler answers a repeated seed anew).",
    )
    compare: list[Literal["teacher", "base"]] = Field(
        default_factory=list,
        max_length=2,
        json_schema_extra={"uniqueItems": True},
        description="Also complete the prompt with the teacher and/or the untrained student; "
        "with the teacher, every completion gets its per-token reverse KL.",
    )
    teacher: Name | None = Field(
        None,
        description="A job with several teachers (`teachers:`): the one compared, by name; "
        "default the first.",
    )
    reference: str | None = Field(
        None,
        max_length=MAX_PROMPT_CHARS,
        description="The reference answer a self teacher with `reference: true` reads after "
        "the question (needed then, with prompt or messages).",
    )
    timeout_seconds: float | None = Field(
        None,
        gt=0,
        le=MAX_TIMEOUT_SECONDS,
        description="How long to wait for a worker; default OPD_SAMPLE_TIMEOUT (60 s).",
    )

    def conversation(self) -> Conversation | None:
        """The chat asked for, with its tools (None: another kind of prompt)."""
        if self.messages is None:
            return None
        return Conversation.model_construct(messages=self.messages, tools=self.tools)

    @model_validator(mode="after")
    def _one_prompt(self) -> SampleRequest:
        given = [self.prompt, self.messages, self.text, self.prompt_token_ids]
        if sum(value is not None for value in given) != 1:
            raise field_error(
                ("prompt",), "give one of prompt, messages, text and prompt_token_ids"
            )
        if self.max_tokens == 0 and not self.prompt_logprobs:
            raise field_error(("max_tokens",), "0 only with prompt_logprobs (nothing to answer)")
        if self.messages is not None:
            Conversation(messages=self.messages, tools=self.tools)  # its rules, by field
            if self.messages[-1].role not in OPEN_ENDED:
                raise field_error(
                    ("messages",), "the last message must be the user's or a tool's reply"
                )
        elif self.tools is not None:
            raise field_error(("tools",), "only with messages")
        if len(set(self.compare)) != len(self.compare):
            raise field_error(("compare",), "each model at most once")
        if self.model in self.compare:
            raise field_error(("compare",), f"{shown(self.model)} is the model asked for already")
        return self


def missing_reference(teacher: TeacherSpec, request: SampleRequest) -> str | None:
    """Why a self teacher that reads reference answers cannot render this request: it
    gives a question or a chat without the answer the teacher reads."""
    if teacher.self is None or not teacher.self.reference:
        return None
    if (request.prompt is None and request.messages is None) or request.reference is not None:
        return None
    return (
        "the job's teacher reads each question's reference answer (teacher.self.reference): "
        "give it as reference"
    )


class SampleTask(BaseModel):
    """What a worker needs to answer a SampleRequest: the job's spec (its backend, models
    and prompt rendering), the weights to load, and the deadline (Unix time)."""

    request: SampleRequest
    spec: JobSpec
    weights_path: str
    deadline: float


class TopLogprob(BaseModel):
    """One of the likeliest tokens at a position."""

    token_id: int
    token: str = Field(description="The token decoded on its own.")
    logprob: float | None = Field(description="Null: not finite.")


class Completion(BaseModel):
    text: str = Field(description="The completion's text, up to the first stop string.")
    tokens: list[str] = Field(description="The completion's tokens, decoded one by one.")
    token_ids: list[int]
    logprobs: list[float | None] = Field(
        description="Each token's logprob under the model that sampled it (null: not finite)."
    )
    stop_reason: str
    teacher_logprobs: list[float | None] | None = Field(
        None,
        description="The teacher's logprob of each token (when the teacher is compared), "
        "after its own rendering of the prompt; a teacher with another tokenizer's own "
        "logprobs mapped onto these tokens by byte offsets, as training maps them.",
    )
    reverse_kl: list[float | None] | None = Field(
        None, description="logprobs - teacher_logprobs per token (when the teacher is compared)."
    )
    teacher_tokens_read: int | None = Field(
        None,
        description="The tokens the teacher read to score the completion (when the teacher "
        "is compared): its own prompt and the completion, as its own tokens.",
    )
    aligned_bytes_fraction: float | None = Field(
        None,
        description="A teacher with another tokenizer: the fraction of the completion's "
        "bytes whose runs of tokens the two tokenizers cut alike (`opd/aligned_bytes_fraction`).",
    )
    top_logprobs: list[list[TopLogprob]] | None = Field(
        None, description="The likeliest tokens at each token, likeliest first (top_logprobs)."
    )


class ModelOutput(BaseModel):
    model: ModelRole = Field(
        description="`checkpoint`: the weights asked for; `teacher`; `base`: the student "
        "before training."
    )
    base_model: str
    weights: str | None = Field(description="The saved weights loaded on the base model.")
    cached: bool = Field(description="The worker had this model loaded already.")
    prompt: str = Field(
        description="The prompt as this model reads it: rendered by its own tokenizer (its "
        "chat template for a question or a chat)."
    )
    prompt_tokens: int
    prompt_token_ids: list[int] = Field(description="The prompt's tokens, in its own tokenizer.")
    prompt_pieces: list[str] | None = Field(
        None, description="Each prompt token decoded on its own (with `prompt_logprobs`)."
    )
    completions: list[Completion]
    reverse_kl_mean: float | None = Field(
        None, description="Over every token of the completions (when the teacher is compared)."
    )
    prompt_logprobs: list[float | None] | None = Field(
        None,
        description="Each prompt token's logprob under this model, null for the first (and "
        "where not finite); with `prompt_logprobs` only.",
    )
    prompt_top_logprobs: list[list[TopLogprob] | None] | None = Field(
        None,
        description="The likeliest tokens at each prompt token, null for the first; with "
        "`prompt_logprobs` and `top_logprobs`.",
    )


class SampleAnswer(BaseModel):
    """The models' outputs; the prompt fields are those of the model asked for (the first
    output's): each output has its own, as its own tokenizer renders the prompt."""

    prompt: str = Field(
        description="The prompt as the model asked for reads it (chat template applied)."
    )
    prompt_tokens: int
    prompt_token_ids: list[int] | None = Field(None, description="The prompt's tokens.")
    prompt_pieces: list[str] | None = Field(
        None, description="Each prompt token decoded on its own (with `prompt_logprobs`)."
    )
    outputs: list[ModelOutput]
    seconds: float = Field(description="The worker's time on the request.")


class TaskFailure(BaseModel):
    """Why a worker could not do a task: a code (the engine's) and what to do about it."""

    code: str
    message: str


class Outcome(BaseModel, Generic[T]):
    """A short task's result as it travels back through Redis: a value or a failure."""

    value: T | None = None
    failure: TaskFailure | None = None


class ArchiveTask(BaseModel):
    """Fetch a remote backend's archive of a checkpoint into `destination` (a file under
    the shared artifact folder), with the job's backend options."""

    spec: JobSpec
    path: str
    destination: str


class Archive(BaseModel):
    path: str
    sha256: str
    size: int
