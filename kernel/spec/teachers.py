"""The teachers: a model the backend loads (its base, its weights), or a model on an
inference server; several by name, with their weights in a mixture.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from kernel.spec.base import MAX_RETRY_DELAY_SECONDS, ModelName, SpecModel, field_error
from kernel.spec.data import MAX_PROMPT_CHARS
from kernel.spec.student import SavedWeights

MAX_SERVER_BATCH = 256
STORED = "stored"
"""The validation context's flag of a spec read back from storage (`stored_spec`)."""
MAX_SERVER_CONCURRENCY = 64


class TeacherServer(SpecModel):
    """A teacher served elsewhere (vLLM, SGLang, this service's `/v1/completions`): it
    scores token-id prompts through the OpenAI-compatible completions protocol, with
    `echo` + `logprobs` and `max_tokens: 0`, or vLLM's `prompt_logprobs`. Only the servers
    the operator lists (OPD_TEACHER_SERVERS) may be named, and the key sent to one is the
    one the operator bound to it there: a spec names the server, never a credential."""

    url: str = Field(
        max_length=1000,
        description="The server's OpenAI-compatible base URL, e.g. http://vllm:8000/v1 "
        "(requests go to <url>/completions).",
    )
    model: ModelName = Field(description="The model name the server serves, e.g. job-12.")
    api_key_env: SkipJsonSchema[Any] = Field(None, exclude=True)
    """Gone: a spec may not name a worker variable (refused by `_no_key_variable`)."""
    tokenizer: ModelName | None = Field(
        None,
        description="A model whose tokenizer is the server model's (loaded by the student's "
        "backend); null = the student's. The preflight checks it against the server.",
    )
    protocol: Literal["echo", "prompt_logprobs"] = Field(
        "echo",
        description="echo: OpenAI's legacy echo + logprobs (vLLM, SGLang, this service); "
        "prompt_logprobs: vLLM's prompt_logprobs, keyed by token id (needed for a top-k "
        "objective).",
    )
    batch_size: int = Field(
        8,
        ge=1,
        le=MAX_SERVER_BATCH,
        description="Prompts sent in one request, gathered from the scores asked for at once.",
    )
    max_concurrency: int = Field(
        4, ge=1, le=MAX_SERVER_CONCURRENCY, description="Requests in flight at once."
    )
    timeout_seconds: float = Field(
        120.0, gt=0.0, le=3600.0, description="Longest wait for one request's answer."
    )
    max_retries: int = Field(
        4,
        ge=0,
        le=20,
        description="Retries of a request that failed transiently (429, 5xx, a timeout or "
        "a dropped connection), with backoff; 0 = none.",
    )
    retry_delay_seconds: float = Field(
        1.0,
        gt=0.0,
        le=MAX_RETRY_DELAY_SECONDS,
        description="Wait before the first retry; it doubles each time (at most "
        f"{MAX_RETRY_DELAY_SECONDS:.0f} s), scaled by a random 50-100%.",
    )

    @field_validator("api_key_env", mode="before")
    @classmethod
    def _no_key_variable(cls, value: Any, info: ValidationInfo) -> None:
        """A 422 for a new spec; a stored one (`stored_spec`) keeps it in its JSON, read as
        absent (the operator's binding decides the key)."""
        if (info.context or {}).get(STORED):
            return None
        raise ValueError(
            "a spec no longer names the variable holding a server's key: the operator binds "
            "each server to its key in OPD_TEACHER_SERVERS (a JSON map of server URL to the "
            "worker's variable holding its key); remove api_key_env and name the server's url"
        )

    @field_validator("url")
    @classmethod
    def _http_server(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("should be an http:// or https:// URL of an inference server")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError(
                "must be a base URL without credentials, query or fragment (the operator binds "
                "its key in OPD_TEACHER_SERVERS)"
            )
        return url.rstrip("/")


MAX_SELF_EXAMPLES = 32


SELF_BASE_MODEL = "(the student's)"
"""What a self teacher's base_model holds until the job fills in the student's."""


class SelfExample(SpecModel):
    """One turn a self teacher reads before the question: a question and its answer."""

    user: str = Field(
        min_length=1, max_length=MAX_PROMPT_CHARS, description="The example's question."
    )
    assistant: str = Field(
        max_length=MAX_PROMPT_CHARS, description="The answer the teacher reads to it."
    )


class SelfTeacher(SpecModel):
    """The student's own model as its teacher, reading a privileged context the student
    does not see (a system line, example turns, the datum's reference answer, the
    feedback given on it): the
    student learns to answer as if it had read it (self-distillation, context
    distillation: "bake a prompt into the weights")."""

    weights: Literal["base", "current"] = Field(
        "base",
        description="base: the student's base model, its adapter off (frozen); current: the "
        "student's weights that sampled the completion (with max_steps_off_policy, the "
        "sampler's version, not the trainer's newer weights).",
    )
    system: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROMPT_CHARS,
        description="A system line the teacher reads first; null = none (the student's chat "
        "template's own default, if it has one).",
    )
    examples: list[SelfExample] = Field(
        default_factory=list,
        max_length=MAX_SELF_EXAMPLES,
        description="Turns the teacher reads before the question, each a user question and "
        "the assistant's answer.",
    )
    reference: bool = Field(
        False,
        description="Also put the datum's reference answer after the question, as "
        '"Reference answer: ..." (every prompt then needs one).',
    )
    context: Literal["feedback"] | None = Field(
        None,
        description="feedback: also put the feedback given on the row (a stored "
        "completion's corrections and notes, `dataset.source: stored_completions`) after the "
        'question, as "Feedback: ..." (hindsight self-distillation); rows without feedback '
        "are left out.",
    )

    @model_validator(mode="after")
    def _some_context(self) -> SelfTeacher:
        if self.weights == "current" and not self.has_context():
            raise field_error(
                ("weights",),
                "a self teacher of the current weights without a context (system, examples "
                "or reference) is the student itself: its reverse KL is always 0",
            )
        return self

    def has_context(self) -> bool:
        return (
            self.system is not None
            or bool(self.examples)
            or self.reference
            or self.context is not None
        )


class TeacherSpec(SpecModel):
    base_model: ModelName = Field(
        description="As student.base_model; frozen. With server: defaults to server.model "
        "(the name its tokens are priced at). With self: the student's, filled in."
    )
    model_path: str | None = Field(
        None,
        max_length=1000,
        description="Weights to load on top of base_model that this service did not save: "
        "a folder under the server's data root (local backend) or the backend's URI.",
    )
    init_from: SavedWeights | None = Field(
        None,
        description="Or the sampler weights a job of the team saved (distil from a teacher "
        "trained here); base_model must be that job's student.base_model.",
    )

    server: TeacherServer | None = Field(
        None,
        description="Or a model on an inference server the operator listed, which scores "
        "the student's tokens over HTTP.",
    )
    self: SelfTeacher | None = Field(
        None,
        description="Or the student's own model reading a context the student does not "
        "see (self-distillation); no second model is loaded.",
    )

    @model_validator(mode="before")
    @classmethod
    def _named_by_its_server(cls, data: Any) -> Any:
        """A server teacher needs no base_model: it is the server's model; nor does a self
        teacher, whose model is the student's (the job fills it in)."""
        if isinstance(data, dict) and data.get("base_model") is None:
            server = data.get("server")
            if isinstance(server, dict):  # without a model the server is refused for it
                return {**data, "base_model": server.get("model") or "(server)"}
            if data.get("self") is not None:
                return {**data, "base_model": SELF_BASE_MODEL}
        return data

    @model_validator(mode="after")
    def _one_source_of_weights(self) -> TeacherSpec:
        given = [
            name
            for name in ("model_path", "init_from", "server", "self")
            if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise field_error(
                (given[1],), f"give teacher.{given[0]} or teacher.{given[1]}, not both"
            )
        return self

    def weights(self) -> str | None:
        """The weights loaded on top of base_model, if any."""
        return self.init_from.path if self.init_from is not None else self.model_path


class MixedTeacher(TeacherSpec):
    """One of several teachers (`teachers:`), with its weight in a mixture."""

    weight: float = Field(
        1.0, gt=0.0, le=1e6, description="teacher_mixture: mixture: its share of the mixture."
    )


MAX_TEACHERS = 8
SINGLE_TEACHER = "teacher"
"""The name `teacher:` goes by where teachers are named (usage, the playground)."""


SEVERAL_TEACHER_MODELS = "(several teacher models)"


def priced_teacher(teacher_model: str, teachers: dict[str, Any] | None) -> str:
    """The teacher model a job's scored tokens are priced at: its one teacher's, the one
    model all its teachers share, or a name no price table has (the cost is then unknown,
    never a wrong model's). Takes the stored spec's parts, so the usage query can too."""
    if not teachers:
        return teacher_model
    models = {teacher["base_model"] for teacher in teachers.values()}
    return models.pop() if len(models) == 1 else SEVERAL_TEACHER_MODELS
