"""The OPD job spec: one schema for the API, the CLI and the worker.

Defaults equal the reference scripts' defaults; every count is bounded so that a
spec can neither divide by zero nor ask a shared service for unbounded work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from kernel.json_types import JsonModel, load_yaml
from kernel.model_names import preset_tokenizer
from kernel.wording import one_line, problems, shown

DEFAULT_QUESTION_SUFFIX = (
    "Please solve the problem step by step and put the final answer in \\boxed{}."
)
DEEPMATH_SHARDS = 10
MAX_STEPS = 100_000
MAX_BATCH_SIZE = 1024
MAX_GROUP_SIZE = 256
MAX_TOKENS = 32_768
MAX_STEPS_OFF_POLICY = 8
MAX_SAMPLE_SIZE = 10_000_000
MAX_INLINE_PROMPTS = 10_000
MAX_EVAL_PROMPTS = 10_000
MAX_PROMPT_CHARS = 100_000
MAX_METADATA_KEYS = 32
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 1024
MAX_RETRY_DELAY_SECONDS = 30.0

Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ModelName = Annotated[str, Field(min_length=1, max_length=500)]


class SpecModel(JsonModel):
    """Base for every spec group: unknown keys are an error, not a silent no-op, a number
    must be finite (JSON has no NaN or Infinity, and a database's JSON refuses them), and
    each field takes the JSON type its schema says (`true` is no count)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def checkpoint_ref(value: Any) -> str | int:
    """`final`, or a step number (0..MAX_STEPS)."""
    if value == "final":
        return "final"
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEPS:
        return value
    raise ValueError(
        f"should be 'final' or a step number from 0 to {MAX_STEPS}, not {shown(value)}"
    )


CheckpointRef = Annotated[
    str | int,
    PlainValidator(checkpoint_ref),
    WithJsonSchema(
        {"anyOf": [{"const": "final"}, {"type": "integer", "minimum": 0, "maximum": MAX_STEPS}]}
    ),
]
"""A job's saved weights: `final` (saved when it ended) or the step they were saved after."""


class SavedWeights(SpecModel):
    """Weights a job of the service saved, named by the job and the checkpoint: the API
    checks the job is the caller's team's and fills in where they are."""

    job: int | None = Field(
        None, ge=1, le=2**31 - 1, description="The job that saved them (the service)."
    )
    checkpoint: CheckpointRef = Field(
        "final", description="`final`: saved when that job ended; N: saved after step N."
    )
    path: str | None = Field(
        None,
        max_length=1000,
        description="Where they are: the service fills it from `job` and `checkpoint` (and "
        "refuses one given); `opd run` takes it instead of `job`.",
    )

    @model_validator(mode="after")
    def _names_a_state(self) -> SavedWeights:
        if self.job is None and self.path is None:
            raise field_error(
                ("job",), "init_from needs a job (submitted to the service) or a path"
            )
        return self


class InitFrom(SavedWeights):
    """Where a continued job's student starts: a training state another job saved."""

    with_optimizer: bool = Field(
        False,
        description="Also restore the optimizer (Adam's moments and step count); false = the "
        "weights only, with a fresh optimizer.",
    )


class StudentSpec(SpecModel):
    base_model: ModelName = Field(
        description="A built-in preset (local backend), a hub id (org/name) or, on the local "
        "backend, a model folder."
    )
    lora_rank: int = Field(32, ge=4, le=64, description="PyTRIO accepts 4..64.")
    seed: int = Field(42, ge=0, le=2**31 - 1)
    init_from: InitFrom | None = Field(
        None, description="Start from another job's saved state instead of a fresh LoRA."
    )


MAX_SERVER_BATCH = 256
MAX_SERVER_CONCURRENCY = 64
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class TeacherServer(SpecModel):
    """A teacher served elsewhere (vLLM, SGLang, this service's `/v1/completions`): it
    scores token-id prompts through the OpenAI-compatible completions protocol, with
    `echo` + `logprobs` and `max_tokens: 0`, or vLLM's `prompt_logprobs`. Only the servers
    the operator lists (OPD_TEACHER_SERVERS) may be named."""

    url: str = Field(
        max_length=1000,
        description="The server's OpenAI-compatible base URL, e.g. http://vllm:8000/v1 "
        "(requests go to <url>/completions).",
    )
    model: ModelName = Field(description="The model name the server serves, e.g. job-12.")
    api_key_env: str | None = Field(
        None,
        max_length=200,
        pattern=ENV_NAME,
        description="The worker's environment variable that holds the server's key (sent "
        "as a bearer token); the key itself is never stored. null = no key.",
    )
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

    @field_validator("url")
    @classmethod
    def _http_server(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("should be an http:// or https:// URL of an inference server")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError(
                "must be a base URL without credentials, query or fragment (the key is read "
                "from the worker's environment: api_key_env)"
            )
        return url.rstrip("/")


class TeacherSpec(SpecModel):
    base_model: ModelName = Field(
        description="As student.base_model; frozen. With server: defaults to server.model "
        "(the name its tokens are priced at)."
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

    @model_validator(mode="before")
    @classmethod
    def _named_by_its_server(cls, data: Any) -> Any:
        """A server teacher needs no base_model: it is the server's model."""
        if isinstance(data, dict) and data.get("base_model") is None:
            server = data.get("server")
            if isinstance(server, dict):  # without a model the server is refused for it
                return {**data, "base_model": server.get("model") or "(server)"}
        return data

    @model_validator(mode="after")
    def _one_source_of_weights(self) -> TeacherSpec:
        given = [
            name
            for name in ("model_path", "init_from", "server")
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


def require_source(schema: dict[str, Any]) -> None:
    """The dataset union tells its members apart by `source`, so a dataset that is given
    must name its source; the documented schema says so too (the default is for Python)."""
    schema["required"] = ["source", *schema.get("required", [])]


class PromptOptions(SpecModel):
    """How every source's questions become chat prompts; the base of every dataset source."""

    model_config = ConfigDict(json_schema_extra=require_source)

    question_suffix: str = Field(DEFAULT_QUESTION_SUFFIX, max_length=MAX_PROMPT_CHARS)
    enable_thinking: bool = False


class DeepMathDataset(PromptOptions):
    """DeepMath-103K parquet shards downloaded from ModelScope, as the reference does."""

    source: Literal["deepmath"] = "deepmath"
    repo: str = Field("AI-ModelScope/DeepMath-103K", pattern=r"^[\w.-]+/[\w.-]+$")
    revision: str = Field("master", min_length=1, max_length=200)
    num_shards: int = Field(1, ge=1, le=DEEPMATH_SHARDS)
    sample_size: int | None = Field(
        1000, ge=1, le=MAX_SAMPLE_SIZE, description="Prompts kept after shuffling; null = all."
    )
    seed: int = Field(42, ge=0, le=2**31 - 1)


FILE_ID = r"^file-[1-9][0-9]{0,9}$"
BLOB = r"^[0-9a-f]{64}\.(jsonl|parquet|csv)$"


class FileDataset(PromptOptions):
    """A parquet, JSONL or CSV file: one the team uploaded (`file`, POST /v1/files), or one
    under the server's data root (`path`, relative paths resolve there; for operators)."""

    source: Literal["file"] = "file"
    path: str | None = Field(None, min_length=1, max_length=1000)
    file: str | None = Field(
        None,
        pattern=FILE_ID,
        description="An uploaded file of the team, e.g. file-12; `field` and `answer_field` "
        "not given are the ones its upload found.",
    )
    blob: str | None = Field(
        None,
        pattern=BLOB,
        description="Filled by the service from `file` (its bytes' sha256 and format); "
        "refused if given.",
    )
    field: str = Field("question", min_length=1, max_length=200)
    answer_field: str | None = Field(
        None, min_length=1, max_length=200, description="The reference answers, for eval."
    )
    sample_size: int | None = Field(None, ge=1, le=MAX_SAMPLE_SIZE)
    seed: int = Field(42, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _one_place(self) -> FileDataset:
        if (self.path is None) == (self.file is None):
            raise ValueError(
                "give file (an uploaded file's id, file-N) or path (a file under the "
                "server's data root), not both"
            )
        return self

    def where(self) -> str:
        """How messages name it: its file id or its path."""
        return self.file or self.path or ""


class InlineDataset(PromptOptions):
    """Prompts written into the spec itself, used in order (no shuffle)."""

    source: Literal["inline"] = "inline"
    prompts: list[Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]] = Field(
        min_length=1, max_length=MAX_INLINE_PROMPTS
    )
    answers: list[Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]] | None = Field(
        None, description="The reference answer of each prompt, in order, for eval."
    )

    @model_validator(mode="after")
    def _an_answer_per_prompt(self) -> InlineDataset:
        if self.answers is not None and len(self.answers) != len(self.prompts):
            raise field_error(
                ("answers",),
                f"has {len(self.answers)} entries for {len(self.prompts)} prompts",
            )
        return self


ArithmeticOp = Literal["add", "sub", "mul"]
ARITHMETIC_SUFFIX = "Answer in \\boxed{}."
MAX_OPERAND_DIGITS = 3


def operand_count(digits: int) -> int:
    """How many operands of `digits` digits there are (1 digit: 0..9; else no leading 0)."""
    return 10 if digits == 1 else 9 * 10 ** (digits - 1)


class ArithmeticDataset(PromptOptions):
    """Generated problems such as "What is 47 + 38?", with their answers: a task small
    models learn on a CPU, for demos and benchmarks that show a student getting better."""

    source: Literal["arithmetic"] = "arithmetic"
    question_suffix: str = Field(ARITHMETIC_SUFFIX, max_length=MAX_PROMPT_CHARS)
    ops: list[ArithmeticOp] = Field(
        ["add", "sub", "mul"],
        min_length=1,
        max_length=3,
        description="Operations, taken in turn; sub keeps the first operand the larger.",
    )
    digits: int = Field(
        1,
        ge=1,
        le=MAX_OPERAND_DIGITS,
        description="Digits of each add/sub operand and of mul's first operand.",
    )
    multiplier_digits: int = Field(
        1, ge=1, le=MAX_OPERAND_DIGITS, description="Digits of mul's second operand."
    )
    count: int = Field(
        150,
        ge=1,
        le=MAX_SAMPLE_SIZE,
        description="Problems in the training pool; held-out prompts come from the others.",
    )
    seed: int = Field(42, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _unique_ops(self) -> ArithmeticDataset:
        if len(set(self.ops)) != len(self.ops):
            raise field_error(("ops",), "lists an operation twice")
        return self

    def problem_count(self, op: ArithmeticOp) -> int:
        """How many distinct problems `op` has at these digit counts."""
        first = operand_count(self.digits)
        if op == "add":
            return first * first
        if op == "sub":
            return first * (first + 1) // 2
        return first * operand_count(self.multiplier_digits)


DatasetSpec = Annotated[
    DeepMathDataset | FileDataset | InlineDataset | ArithmeticDataset,
    Field(discriminator="source"),
]


class DatasetShare(SpecModel):
    """What a dataset under `datasets:` adds to its source: a name, its share of each
    step's prompts and, with teacher_mixture: route, the teacher that scores them."""

    name: Name
    weight: float = Field(1.0, gt=0.0, le=1e6, description="Its share of each step's prompts.")
    teacher: Name | None = Field(None, description="route: the teacher (under teachers) to use.")


class SharedDeepMath(DeepMathDataset, DatasetShare):
    pass


class SharedFile(FileDataset, DatasetShare):
    pass


class SharedInline(InlineDataset, DatasetShare):
    pass


class SharedArithmetic(ArithmeticDataset, DatasetShare):
    pass


SharedDataset = Annotated[
    SharedDeepMath | SharedFile | SharedInline | SharedArithmetic,
    Field(discriminator="source"),
]
MAX_TEACHERS = 8
MAX_DATASETS = 16
SINGLE_TEACHER = "teacher"
"""The name `teacher:` goes by where teachers are named (usage, the playground)."""
SINGLE_DATASET = "dataset"


class SamplingSpec(SpecModel):
    max_tokens: int = Field(512, ge=1, le=MAX_TOKENS)
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(
        -1, ge=-1, description="-1 = no top-k truncation.", json_schema_extra={"not": {"const": 0}}
    )

    @model_validator(mode="after")
    def _top_k_not_zero(self) -> SamplingSpec:
        if self.top_k == 0:
            raise field_error(("top_k",), "must be -1 (off) or >= 1")
        return self


class OptimSpec(SpecModel):
    """AdamW parameters, passed to the backend as PyTRIO's AdamParams."""

    learning_rate: float = Field(4e-5, gt=0.0, le=1.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    eps: float = Field(1e-12, gt=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    grad_clip_norm: float = Field(0.0, ge=0.0, description="0 = no clipping.")


LossName = Literal["importance_sampling", "ppo", "cispo", "dro"]
# Each loss's options and their defaults: Tinker's documented ones (PyTRIO follows Tinker's
# loss definitions); DRO's beta has no documented default, so ours is the documented example.
LOSS_OPTIONS: dict[str, dict[str, float]] = {
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": 0.05},
}


class LossConfig(SpecModel):
    """Options of the policy losses (PyTRIO's `loss_fn_config`); unset ones take the
    defaults above, and the loop always sends them, so every backend trains alike."""

    clip_low_threshold: float | None = Field(
        None, ge=0.0, le=1.0, description="ppo and cispo: the lowest importance ratio kept."
    )
    clip_high_threshold: float | None = Field(
        None, ge=1.0, le=100.0, description="ppo and cispo: the highest importance ratio kept."
    )
    beta: float | None = Field(
        None, gt=0.0, le=100.0, description="dro: weight of the quadratic penalty."
    )


class RewardSpec(SpecModel):
    """A verifiable outcome reward beside the teacher's: r = 1 for a completion whose
    answer the grader accepts, else 0; each token's advantage gains coef * (r - mean r of
    the completions of its prompt)."""

    coef: float = Field(0.0, ge=0.0, le=1000.0, description="0 = pure OPD (the reference).")
    grader: Literal["boxed"] = Field(
        "boxed", description="The eval's grader: the last \\boxed{} against the reference answer."
    )


ObjectiveName = Literal["sampled_reverse_kl", "reverse_kl", "forward_kl", "jsd"]
LOGIT_OBJECTIVES = ("reverse_kl", "forward_kl", "jsd")
MAX_OBJECTIVE_TOP_K = 1024


class ObjectiveSpec(SpecModel):
    """What each step minimises (docs/algorithm.md#objectives). The reference,
    `sampled_reverse_kl`, learns from one number per token: the sampled token's
    student - teacher logprob as a policy-gradient advantage. The others compare the
    student's and the teacher's distributions at every completion position: over the full
    vocabulary (`top_k: 0`), or over k kept tokens plus one bucket for the rest."""

    kind: ObjectiveName = Field(
        "sampled_reverse_kl",
        description="sampled_reverse_kl: the reference (a policy gradient on the sampled "
        "token's reverse KL); reverse_kl: KL(student || teacher); forward_kl: "
        "KL(teacher || student); jsd: the generalized Jensen-Shannon divergence with `beta`.",
    )
    top_k: int = Field(
        0,
        ge=0,
        le=MAX_OBJECTIVE_TOP_K,
        description="0 = the full vocabulary. k: the student's top k tokens (reverse_kl) or "
        "the teacher's (forward_kl, jsd) at each position, plus a tail bucket.",
    )
    beta: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="jsd only (default 0.5): the teacher's weight in the mixture "
        "m = beta * teacher + (1 - beta) * student; 0 is forward KL, 1 reverse KL, as TRL's "
        "generalized JSD.",
    )
    tail: bool | None = Field(
        None,
        description="With top_k: whether the rest of the vocabulary counts as one more "
        "bucket (default true); false sums the divergence over the kept tokens only.",
    )

    @model_validator(mode="before")
    @classmethod
    def _a_name_alone(cls, data: Any) -> Any:
        """`objective: jsd` is `objective: {kind: jsd}`."""
        return {"kind": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _options_fit_the_kind(self) -> ObjectiveSpec:
        if self.kind == "sampled_reverse_kl" and (self.top_k or self.tail is not None):
            raise field_error(
                ("top_k",) if self.top_k else ("tail",),
                "sampled_reverse_kl learns from the sampled token alone: top_k and tail "
                "apply to reverse_kl, forward_kl and jsd",
            )
        if self.beta is not None and self.kind != "jsd":
            raise field_error(("beta",), f"beta is jsd's mixture weight; {self.kind} has none")
        if self.tail is not None and not self.top_k:
            raise field_error(
                ("tail",), "tail is the bucket beside the top_k tokens: it needs top_k >= 1"
            )
        return self

    @property
    def logit_level(self) -> bool:
        """Whether it compares distributions (anything but the reference)."""
        return self.kind != "sampled_reverse_kl"

    @property
    def mixture_weight(self) -> float:
        """jsd's beta, its default filled in."""
        return 0.5 if self.beta is None else self.beta

    @property
    def keeps_tail(self) -> bool:
        return self.tail is not False


class LoopSpec(SpecModel):
    steps: int = Field(10, ge=1, le=MAX_STEPS)
    batch_size: int = Field(2, ge=1, le=MAX_BATCH_SIZE)
    group_size: int = Field(2, ge=1, le=MAX_GROUP_SIZE)
    kl_penalty_coef: float = Field(1.0, ge=0.0, le=1000.0)
    kl_discount_factor: float = Field(
        0.0, ge=0.0, le=1.0, description="0 = the reference (per-token advantage only)."
    )
    loss_fn: LossName = Field(
        "importance_sampling",
        description="The policy losses that make sense for OPD datums (cross_entropy does "
        "not: their prompt targets are 0 and they carry no weights).",
    )
    loss_fn_config: LossConfig = Field(default_factory=LossConfig)
    sampler_refresh_steps: int = Field(1, ge=1, le=MAX_STEPS)
    max_steps_off_policy: int = Field(
        0,
        ge=0,
        le=MAX_STEPS_OFF_POLICY,
        description="0 = on-policy (the reference). k >= 1: step t trains on rollouts sampled "
        "from the weights of step t - k, sampled while the steps before it train (faster, "
        "rollouts up to k optimizer steps old).",
    )
    save_every: int = Field(0, ge=0, le=MAX_STEPS, description="0 = only the final weights.")
    save_weights_name: Name | None = Field(
        None,
        description="The name the saved weights and states go by; null: the job's `name`.",
    )
    reward: RewardSpec = Field(default_factory=RewardSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    keep_samples: int = Field(
        2,
        ge=0,
        le=16,
        description="Rollouts kept per step for people to read (prompt, completion, per-token "
        "reverse KL); long jobs keep them on evenly spread steps.",
    )

    @model_validator(mode="after")
    def _saves_on_refresh_boundaries(self) -> LoopSpec:
        if self.save_every % self.sampler_refresh_steps:
            raise field_error(
                ("save_every",),
                "must be a multiple of sampler_refresh_steps, so that a resumed "
                "run samples from the same weights as an uninterrupted one",
            )
        return self

    @model_validator(mode="after")
    def _off_policy_refreshes_every_step(self) -> LoopSpec:
        if self.max_steps_off_policy and self.sampler_refresh_steps != 1:
            raise field_error(
                ("max_steps_off_policy",),
                "needs sampler_refresh_steps: 1 (each step's rollouts "
                "come from the weights exactly max_steps_off_policy steps back)",
            )
        return self

    @model_validator(mode="after")
    def _options_fit_the_loss(self) -> LoopSpec:
        given = self.loss_fn_config.model_dump(exclude_none=True)
        if unknown := sorted(given.keys() - LOSS_OPTIONS[self.loss_fn].keys()):
            raise field_error(
                ("loss_fn_config", unknown[0]),
                f"{self.loss_fn} has no option {', '.join(unknown)}",
            )
        options = self.loss_options() or {}
        if options.get("clip_low_threshold", 0.0) >= options.get("clip_high_threshold", 1.0):
            raise field_error(
                ("loss_fn_config", "clip_low_threshold"), "must be below clip_high_threshold"
            )
        return self

    @model_validator(mode="after")
    def _objective_fits_the_loop(self) -> LoopSpec:
        if not self.objective.logit_level:
            return self
        kind = self.objective.kind
        if self.kl_discount_factor:
            raise field_error(
                ("kl_discount_factor",),
                f"discounting sums the sampled token's advantages over the rest of the "
                f"completion; objective {kind} takes its gradient at each position from the "
                "distributions: use 0, or objective sampled_reverse_kl",
            )
        if self.loss_fn != "importance_sampling" and not self.reward.coef:
            raise field_error(
                ("loss_fn",),
                f"with objective {kind} the policy loss trains only the reward's advantages, "
                "and reward.coef is 0: set a reward, or leave loss_fn at importance_sampling",
            )
        return self

    def loss_options(self) -> dict[str, float] | None:
        """The `loss_fn_config` every backend gets: the loss's options, defaults filled in
        (None for importance_sampling, which has none)."""
        defaults = LOSS_OPTIONS[self.loss_fn]
        return defaults | self.loss_fn_config.model_dump(exclude_none=True) if defaults else None


class EvalSpec(SpecModel):
    """Held-out evaluation of the student, on a schedule; it never changes the training."""

    every: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="Steps between evals; 0 = before the first step and "
        "after the last only (both always run).",
    )
    holdout: int = Field(
        0,
        ge=0,
        le=MAX_EVAL_PROMPTS,
        description="Prompts drawn (seeded) from the job's dataset rows the training pool "
        "does not use, with their reference answers.",
    )
    dataset: DatasetSpec | None = Field(None, description="Or a dataset of its own.")
    samples_per_prompt: int = Field(1, ge=1, le=64, description="> 1 adds eval/pass@k.")
    max_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="null = sampling.max_tokens."
    )
    temperature: float = Field(
        1.0, ge=0.0, le=10.0, description="1 keeps the reverse-KL estimate on-policy."
    )
    teacher_baseline: bool = Field(
        False, description="Also let the teacher answer the same prompts, once."
    )
    seed: int = Field(0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _one_source(self) -> EvalSpec:
        if (self.holdout > 0) == (self.dataset is not None):
            raise field_error(
                ("holdout",), "give eval prompts as one of holdout: N or a dataset (not both)"
            )
        return self


class SwanLabSpec(SpecModel):
    enabled: bool = False
    project: str = Field("trio-case", min_length=1, max_length=200)
    workspace: str | None = Field(None, max_length=200)
    mode: Literal["online", "local", "offline", "disabled"] | None = None


class MlflowSpec(SpecModel):
    """The MLflow run a job is mirrored into (the worker needs the `mlflow` extra)."""

    tracking_uri: str = Field(
        min_length=1,
        max_length=2000,
        description="The tracking server, http(s)://host[:port][/path]; credentials come from "
        "the worker's MLFLOW_TRACKING_TOKEN (or _USERNAME/_PASSWORD), never from the spec.",
    )
    experiment: str = Field("opd", min_length=1, max_length=500)
    run_name: str | None = Field(None, min_length=1, max_length=250, description="null = name.")
    log_final_weights: bool = Field(
        False,
        description="Also upload the final weights (the LoRA adapter folder) as the run's "
        "`final_weights` artifact, when the worker holds them as a folder (backend: local).",
    )

    @field_validator("tracking_uri")
    @classmethod
    def _http_server(cls, uri: str) -> str:
        parts = urlsplit(uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("should be an http:// or https:// URL of a tracking server")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials (the worker's environment holds them)")
        return uri


class TrackersSpec(SpecModel):
    """Experiment trackers a job is mirrored into, beside the service's own records."""

    mlflow: MlflowSpec | None = Field(
        None,
        description="Params, every step's metrics, evals, checkpoint paths (as tags), the "
        "spec as the artifact `opd/spec.yaml` (and, if asked, the final weights) and the "
        "final status; null = none.",
    )


class LocalBackendSpec(SpecModel):
    """Options of the in-process PyTorch backend."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto = bfloat16 on CUDA, float32 on CPU."
    )
    cpu_threads: int = Field(
        1,
        ge=1,
        le=1024,
        description="Torch threads on the CPU. 1 keeps runs bit-for-bit reproducible (a job "
        "resumed after a crash replays exactly); more is faster for large models on a CPU.",
    )


class RemoteBackendSpec(SpecModel):
    """What every remote backend's group holds: the worker's retries of whole calls that
    still fail transiently after the SDK's own retries."""

    call_attempts: int = Field(
        4,
        ge=1,
        le=20,
        description="Tries of a backend call that keeps failing transiently (timeouts, "
        "429, 5xx, dropped connections) after the SDK's own retries; 1 = no retry.",
    )
    call_retry_delay_seconds: float = Field(
        5.0,
        gt=0.0,
        le=MAX_RETRY_DELAY_SECONDS,
        description="Wait before the first call retry; it doubles each time (at most "
        f"{MAX_RETRY_DELAY_SECONDS:.0f} s), scaled by a random 50-100%.",
    )


class TrioBackendSpec(RemoteBackendSpec):
    """Timeouts and retries handed to pytrio.configure before the first client is made."""

    request_timeout_seconds: int = Field(600, ge=1, le=86_400)
    sampling_timeout_seconds: int = Field(600, ge=1, le=86_400)
    retry_max_attempts: int = Field(
        5, ge=1, le=100, description="PyTRIO's tries of one HTTP request."
    )


class TinkerBackendSpec(RemoteBackendSpec):
    """Tinker's SDK retries timeouts, 429 and 5xx itself and has no option for how often;
    what still fails is retried as a whole by the worker (`call_attempts`)."""

    call_timeout_seconds: int = Field(
        3600,
        ge=1,
        le=86_400,
        description="Longest wait for one call's result, time queued at Tinker included; a "
        "call still unanswered then fails as transient.",
    )


Metadata = Annotated[
    dict[
        Annotated[str, Field(min_length=1, max_length=MAX_METADATA_KEY_CHARS)],
        Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)],
    ],
    Field(max_length=MAX_METADATA_KEYS),
]


ABSENT_TEACHER = TeacherSpec(base_model="Qwen/Qwen3.6-27B")
ABSENT_DATASET = DeepMathDataset()
"""What `teacher` and `dataset` hold when `teachers` and `datasets` are given instead: the
reference's, as the specs stored before they were required record them (a spec is stored
with every field)."""


def one_of_each_required(schema: dict[str, Any]) -> None:
    """The schema says what validation does: `teacher` or `teachers`, `dataset` or
    `datasets`, each pair's first required unless its second is given."""
    schema["required"] = [f for f in schema["required"] if f not in ("teacher", "dataset")]
    schema["allOf"] = [
        {"anyOf": [{"required": [single]}, {"required": [several]}]}
        for single, several in (("teacher", "teachers"), ("dataset", "datasets"))
    ]


class JobSpec(SpecModel):
    """Everything one OPD run needs; the public contract of the service. What it trains
    (backend, student, teacher(s), dataset(s)) is always written; the algorithm's settings
    default to the reference's."""

    model_config = ConfigDict(json_schema_extra=one_of_each_required)

    name: Name = "opd-deepmath-qwen35-4b"
    backend: Literal["local", "trio", "tinker"]
    student: StudentSpec
    teacher: TeacherSpec = Field(description="The teacher; or several under `teachers`.")
    dataset: DatasetSpec = Field(description="The prompts; or several under `datasets`.")
    teachers: dict[Name, MixedTeacher] | None = Field(
        None,
        min_length=1,
        max_length=MAX_TEACHERS,
        description="Several teachers by name, instead of `teacher`.",
    )
    datasets: list[SharedDataset] | None = Field(
        None,
        min_length=1,
        max_length=MAX_DATASETS,
        description="Several datasets, each taking its share of every step, instead of `dataset`.",
    )
    teacher_mixture: Literal["route", "mixture"] = Field(
        "route",
        description="route: each prompt is scored by its dataset's teacher; mixture: by the "
        "weighted mixture of every teacher, log sum_i w_i p_i.",
    )
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    optim: OptimSpec = Field(default_factory=OptimSpec)
    loop: LoopSpec = Field(default_factory=LoopSpec)
    eval: EvalSpec | None = Field(None, description="Held-out eval; null = none.")
    swanlab: SwanLabSpec = Field(default_factory=SwanLabSpec)
    trackers: TrackersSpec = Field(default_factory=TrackersSpec)
    local: LocalBackendSpec = Field(default_factory=LocalBackendSpec)
    trio: TrioBackendSpec = Field(default_factory=TrioBackendSpec)
    tinker: TinkerBackendSpec = Field(default_factory=TinkerBackendSpec)
    metadata: Metadata = Field(default_factory=dict)
    priority: int = Field(
        0,
        ge=-100,
        le=100,
        description="The service runs a team's higher-priority queued jobs first; it never "
        "changes the order between teams. Ignored by `opd run`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _several_instead_of_one(cls, data: Any) -> Any:
        """`teachers` (`datasets`) given and `teacher` (`dataset`) not: the latter holds
        ABSENT_TEACHER (ABSENT_DATASET), so that every spec has both."""
        if not isinstance(data, dict):
            return data
        for single, several, absent in (
            ("teacher", "teachers", ABSENT_TEACHER),
            ("dataset", "datasets", ABSENT_DATASET),
        ):
            if data.get(several) is not None and data.get(single) is None:
                data = {**data, single: absent}
        return data

    @property
    def weights_name(self) -> str:
        """What the job's weights and states are saved as: `loop.save_weights_name`, else
        the job's name (left unset, a clone that renames the job renames its weights)."""
        return self.loop.save_weights_name or self.name

    @model_validator(mode="after")
    def _teachers_and_datasets_fit(self) -> JobSpec:
        # A stored spec is dumped with every field, so `teacher` and `dataset` count as
        # given when they differ from what they hold when absent.
        for single, several, default in (
            ("teacher", "teachers", ABSENT_TEACHER),
            ("dataset", "datasets", ABSENT_DATASET),
        ):
            if getattr(self, single) != default and getattr(self, several) is not None:
                raise field_error((several,), f"give either {single} or {several}, not both")
        shares = self.dataset_shares()
        names = [share.name for share in shares]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise field_error(("datasets", index, "name"), f"{name!r} names two datasets")
        teachers = self.teacher_specs()
        if self.teacher_mixture == "route":
            if self.datasets is None and len(teachers) > 1:
                raise field_error(
                    ("datasets",), "route with several teachers needs datasets naming them"
                )
            for index, share in enumerate(shares):
                if self.route_of(share) not in teachers:
                    raise field_error(
                        ("datasets", index, "teacher"),
                        f"names no teacher under teachers ({', '.join(sorted(teachers))})",
                    )
            if unused := sorted(teachers.keys() - {self.route_of(share) for share in shares}):
                raise field_error(("teachers", unused[0]), "no dataset routes to this teacher")
        else:
            for index, share in enumerate(shares):
                if share.teacher is not None:
                    raise field_error(
                        ("datasets", index, "teacher"),
                        "with teacher_mixture: mixture every teacher scores every dataset",
                    )
        if self.loop.batch_size < len(shares):
            raise field_error(
                ("loop", "batch_size"),
                f"must be at least the number of datasets ({len(shares)}): each step takes "
                "a prompt from each",
            )
        self._eval_fits_the_teachers()
        self._objective_fits_the_backend()
        self._servers_fit_the_objective()
        self._objective_fits_the_tokenizers()
        return self

    def _objective_fits_the_tokenizers(self) -> None:
        """A logit-level objective compares distributions over one vocabulary: refused
        with a teacher whose tokenizer is visibly another (presets of the local backend;
        any other model's the worker's preflight reads)."""
        if not self.loop.objective.logit_level or self.backend != "local":
            return
        student = preset_tokenizer(self.student.base_model)
        for name, teacher in self.teacher_specs().items():
            theirs = preset_tokenizer(teacher.base_model)
            if student is not None and theirs is not None and theirs != student:
                raise field_error(
                    ("loop", "objective", "kind"),
                    f"{self.teacher_field(name)} {teacher.base_model!r} has another tokenizer "
                    f"({theirs}, the student's is {student}), and objective "
                    f"{self.loop.objective.kind} compares the two distributions token by "
                    "token, which needs a shared vocabulary: use sampled_reverse_kl",
                )

    def _servers_fit_the_objective(self) -> None:
        """A server teacher answers logprobs over HTTP, never its logits: what needs more
        is refused, never approximated."""
        for name, teacher in self.teacher_specs().items():
            if teacher.server is None:
                continue
            at = (*self.teacher_field(name).split("."), "server")
            if self.trainer_scores():
                raise field_error(
                    at,
                    f"objective {described(self.loop.objective)} on the local backend reads "
                    "the teacher's whole distribution, which a server teacher does not "
                    "send: use objective sampled_reverse_kl, or a teacher the backend loads",
                )
            if self.teacher_top_k() and teacher.server.protocol != "prompt_logprobs":
                raise field_error(
                    (*at, "protocol"),
                    f"objective {described(self.loop.objective)} needs the teacher's top "
                    f"{self.teacher_top_k()} tokens by id at each position: use protocol "
                    "prompt_logprobs (vLLM's), which sends them",
                )
            if self.eval is not None and self.eval.teacher_baseline:
                raise field_error(
                    ("eval", "teacher_baseline"),
                    "a server teacher only scores tokens; it does not answer the eval's "
                    "prompts here",
                )

    def _objective_fits_the_backend(self) -> None:
        """An objective a backend cannot train exactly is refused, never approximated."""
        objective = self.loop.objective
        if not objective.logit_level or self.backend == "local":
            return
        kind, at = objective.kind, ("loop", "objective", "kind")
        if self.backend == "trio":
            raise field_error(
                at,
                f"backend trio cannot train objective {kind}: PyTRIO's cross_entropy takes one "
                "target token per position, so it trains only sampled_reverse_kl (use the "
                "local backend, or Tinker for forward_kl over the teacher's top-k)",
            )
        if kind != "forward_kl" or not objective.top_k or objective.keeps_tail:
            raise field_error(
                at,
                f"backend tinker trains forward_kl over the teacher's top-k tokens without a "
                f"tail bucket (objective: {{kind: forward_kl, top_k: 20, tail: false}}), as "
                "its cross_entropy takes k targets and weights per position; "
                f"{described(objective)} needs more than the teacher's top-k and the "
                "student's logprobs of those "
                "tokens: use the local backend",
            )
        if self.teacher_mixture == "mixture":
            raise field_error(
                ("teacher_mixture",),
                "backend tinker: the top-k of a mixture of teachers is not the top-k of each, "
                "so forward_kl cannot be trained exactly against a mixture; use route",
            )
        if self.loop.loss_fn == "dro":
            raise field_error(
                ("loop", "loss_fn"),
                "backend tinker trains the reward's advantages beside forward_kl in a second "
                "forward_backward, each divided by the completion positions (Tinker sums its "
                "losses where the local backend averages them); dro's penalty does not scale "
                "with the advantages, so it would weigh that many times more: use "
                "importance_sampling, ppo or cispo",
            )

    def teacher_top_k(self) -> int:
        """How many of the teacher's likeliest tokens each score brings back with the
        sampled token's logprob: the objective's top_k on Tinker, whose trainer never sees
        the teacher and learns the teacher's top-k from the datums; else 0 (the reference,
        and the local backend, which reads its teachers' logits itself)."""
        objective = self.loop.objective
        return objective.top_k if self.backend == "tinker" and objective.logit_level else 0

    def trainer_scores(self) -> bool:
        """Whether the trainer scores the sampled tokens with the teacher itself, so the
        rollouts need not: the local backend's logit-level objectives read the teachers'
        whole distributions while training and report the sampled tokens' logprobs."""
        return self.backend == "local" and self.loop.objective.logit_level

    def _eval_fits_the_teachers(self) -> None:
        if self.eval is None or len(self.teacher_specs()) < 2:
            return
        if self.eval.dataset is not None and self.teacher_mixture == "route":
            raise field_error(
                ("eval", "dataset"),
                "with several routed teachers no teacher is the eval dataset's: use "
                "eval.holdout (each dataset's held-out prompts go to its teacher)",
            )
        if self.eval.teacher_baseline and self.teacher_mixture == "mixture":
            raise field_error(
                ("eval", "teacher_baseline"), "a mixture of teachers cannot answer prompts"
            )

    def teacher_specs(self) -> dict[str, TeacherSpec]:
        """Every teacher by name: `teachers`, or `teacher` as the one named "teacher"."""
        return dict(self.teachers) if self.teachers is not None else {SINGLE_TEACHER: self.teacher}

    def with_teacher(self, name: str, teacher: TeacherSpec) -> JobSpec:
        """The spec with teacher `name` (as `teacher_specs` names it) replaced."""
        if self.teachers is None:
            return self.model_copy(update={"teacher": teacher})
        return self.model_copy(update={"teachers": {**self.teachers, name: teacher}})

    def teacher_field(self, name: str) -> str:
        """Where teacher `name` is written in the spec: `teacher` or `teachers.<name>`."""
        return "teacher" if self.teachers is None else f"teachers.{name}"

    def teacher_weights(self) -> dict[str, float]:
        """Each teacher's weight in a mixture (1 for the one `teacher`)."""
        return {name: getattr(spec, "weight", 1.0) for name, spec in self.teacher_specs().items()}

    def dataset_shares(self) -> list[SharedDataset]:
        """Every dataset with its name and weight: `datasets`, or `dataset` as the one
        named "dataset"."""
        if self.datasets is not None:
            return list(self.datasets)
        return [named(self.dataset, SINGLE_DATASET)]

    def route_of(self, share: DatasetShare) -> str | None:
        """The teacher that scores a dataset's prompts under route (its own, or the only
        one); None under mixture, where every teacher does."""
        if self.teacher_mixture == "mixture":
            return None
        teachers = self.teacher_specs()
        return share.teacher or (next(iter(teachers)) if len(teachers) == 1 else None)

    def file_datasets(self) -> list[tuple[str, FileDataset]]:
        """Each file dataset the spec reads, by where it is written (`dataset`,
        `datasets.1`, `eval.dataset`)."""
        read: list[tuple[str, Any]] = [
            (f"datasets.{i}", share) for i, share in enumerate(self.datasets or [])
        ]
        if self.datasets is None:
            read.append(("dataset", self.dataset))
        read.append(("eval.dataset", self.eval and self.eval.dataset))
        return [(field, d) for field, d in read if isinstance(d, FileDataset)]

    def dataset_files(self) -> list[tuple[str, str]]:
        """(field, path) of each dataset file the spec reads by path (`dataset.path`,
        `datasets.1.path`, `eval.dataset.path`): the service confines them all."""
        return [(f"{at}.path", d.path) for at, d in self.file_datasets() if d.path is not None]

    def uploaded_files(self) -> set[str]:
        """The ids of the uploaded files the spec reads."""
        return {d.file for _, d in self.file_datasets() if d.file is not None}

    def with_file_dataset(self, at: str, dataset: FileDataset) -> JobSpec:
        """The spec with the file dataset written at `at` (as `file_datasets` names it)
        replaced by `dataset`."""
        if at == "eval.dataset":
            assert self.eval is not None
            return self.model_copy(
                update={"eval": self.eval.model_copy(update={"dataset": dataset})}
            )
        if at == "dataset":
            return self.model_copy(update={"dataset": dataset})
        index = int(at.removeprefix("datasets."))
        assert self.datasets is not None
        datasets = list(self.datasets)
        datasets[index] = dataset  # type: ignore[assignment]
        return self.model_copy(update={"datasets": datasets})

    def several_datasets(self) -> bool:
        """Whether per-dataset metrics (ending in `/<dataset>`) are recorded."""
        return self.datasets is not None


SEVERAL_TEACHER_MODELS = "(several teacher models)"


def described(objective: ObjectiveSpec) -> str:
    """An objective as messages name it: its kind, its top-k and its tail."""
    if not objective.top_k:
        return f"{objective.kind} over the full vocabulary"
    tail = "with" if objective.keeps_tail else "without"
    return f"{objective.kind} over the top {objective.top_k} tokens {tail} a tail bucket"


def priced_teacher(teacher_model: str, teachers: dict[str, Any] | None) -> str:
    """The teacher model a job's scored tokens are priced at: its one teacher's, the one
    model all its teachers share, or a name no price table has (the cost is then unknown,
    never a wrong model's). Takes the stored spec's parts, so the usage query can too."""
    if not teachers:
        return teacher_model
    models = {teacher["base_model"] for teacher in teachers.values()}
    return models.pop() if len(models) == 1 else SEVERAL_TEACHER_MODELS


def named(dataset: DatasetSpec, name: str) -> SharedDataset:
    """A dataset as one of several, with a name (weight 1, no teacher of its own)."""
    shared = {
        DeepMathDataset: SharedDeepMath,
        FileDataset: SharedFile,
        InlineDataset: SharedInline,
        ArithmeticDataset: SharedArithmetic,
    }[type(dataset)]
    return shared.model_construct(**dict(dataset), name=name)


def field_error(loc: tuple[str | int, ...], message: str) -> ValidationError:
    """A validation error at `loc` (a 422 whose param names the field), for the checks
    that span several fields of the spec."""
    return ValidationError.from_exception_data(
        "JobSpec",
        [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=None)],
    )


class SpecError(ValueError):
    """A spec file that cannot be read or does not validate; the message names the field.
    `problems` holds each validation problem as (field path, message), for a caller that
    shows every one at its field."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


def validation_problems(error: ValidationError, model: Any = None) -> list[tuple[str, str]]:
    """Each problem as (field path, message) in the user's words (kernel/wording.py), e.g.
    `("loop.stesp", "unknown field; did you mean `loop.steps`?")`; against `model`, the
    type validated (default: the job spec)."""
    return problems(error.errors(), JobSpec if model is None else model)


def format_validation_error(error: ValidationError, model: Any = None) -> str:
    """One line per problem, each naming the field path, e.g. `loop.steps: ...`."""
    return one_line(validation_problems(error, model))


def parse_spec(data: Any) -> JobSpec:
    """Validate already-parsed data, raising SpecError with field-named messages."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(format_validation_error(error), validation_problems(error)) from error


def unlisted_tracker(spec: JobSpec, allowed: Sequence[str]) -> str | None:
    """Why a shared service may not mirror `spec` to its MLflow server (one the operator did
    not list: a spec must not make the service call any address it names), or None."""
    tracker = spec.trackers.mlflow
    if tracker is None or tracker.tracking_uri.rstrip("/") in {u.rstrip("/") for u in allowed}:
        return None
    listed = ", ".join(allowed) if allowed else "none are"
    return (
        f"{tracker.tracking_uri} is not one of the MLflow servers this service may send to "
        f"({listed}; the operator lists them in OPD_MLFLOW_TRACKING_URIS)"
    )


def unlisted_teacher_server(spec: JobSpec, allowed: Sequence[str]) -> tuple[str, str] | None:
    """(field, why) for the first teacher server of `spec` that the operator did not list
    (a spec must not make the worker call any address it names), or None."""
    listed = {url.rstrip("/") for url in allowed}
    for name, teacher in spec.teacher_specs().items():
        if teacher.server is None or teacher.server.url in listed:
            continue
        servers = ", ".join(allowed) if allowed else "none are"
        return (
            f"{spec.teacher_field(name)}.server.url",
            f"{teacher.server.url} is not one of the teacher servers this service may call "
            f"({servers}; the operator lists them in OPD_TEACHER_SERVERS)",
        )
    return None


def flatten(spec: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"loop": {"steps": 3}}` -> `{"loop.steps": 3}`; lists stay whole values."""
    flat: dict[str, Any] = {}
    for key, value in spec.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def not_a_mapping(data: Any, what: str) -> str:
    """Why a document is no spec (or sweep): empty, or a list or a value, not a mapping."""
    if data is None:
        return f"{what} is empty: it must be a mapping of fields (`name: value` lines)"
    return f"{what} must be a mapping of fields (`name: value` lines), not {shown(data)}"


def read_document(path: str | Path, what: str = "spec") -> dict[str, Any]:
    """The mapping a YAML or JSON file holds (JSON is YAML, but its own parser says more);
    SpecError naming the file, and the line where it is not YAML or JSON."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(f"cannot read {what} {path}: {error.strerror}") from error
    except UnicodeDecodeError:
        raise SpecError(f"{path} is not UTF-8 text") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else load_yaml(text)
    except json.JSONDecodeError as error:
        raise SpecError(f"{path}, line {error.lineno}: not valid JSON: {error.msg}") from None
    except yaml.YAMLError as error:
        raise SpecError(f"{path}{yaml_problem(error)}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: {not_a_mapping(data, f'a {what}')}")
    return data


def yaml_problem(error: yaml.YAMLError) -> str:
    """`, line 3: not valid YAML: ...` for what PyYAML found, without its `"<unicode
    string>"` (the text it read has no name) or its excerpt of the text."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or "cannot be read"
    context, started = getattr(error, "context", None), getattr(error, "context_mark", None)
    where = "" if mark is None else f", line {mark.line + 1}"
    opened = f" ({context} that starts on line {started.line + 1})" if context and started else ""
    return f"{where}: not valid YAML: {problem}{opened}"


def line_of(root: yaml.Node | None, path: str) -> int | None:
    """The line where the deepest written part of `path` is: its key in a mapping, its item
    in a list. Parts that are not written (a missing field) are skipped, so a missing field
    points at its group."""
    node, line = root, None
    for part in path.split("."):
        child = child_node(node, part)
        if child is None:
            continue
        node, line = child[1], child[0]
    return line


def child_node(node: Any, part: str) -> tuple[int, yaml.Node] | None:
    """(line, value node) of a mapping's key or a sequence's item, if written."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == part:
                return key.start_mark.line + 1, value
    if isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
        item = node.value[int(part)]
        return item.start_mark.line + 1, item
    return None


def load_spec(path: str | Path) -> JobSpec:
    """Read a YAML or JSON spec file; SpecError names the file, and each problem its field
    and the line it is written on (`tiny.yaml, line 12: loop.stesp: unknown field; ...`)."""
    data = read_document(path)
    try:
        return parse_spec(data)
    except SpecError as error:
        try:
            root = yaml.compose(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError:  # JSON that PyYAML's YAML 1.1 does not read: no lines
            root = None
        lines = []
        for field, message in error.problems:
            line = line_of(root, field)
            lines.append(f"{path}{'' if line is None else f', line {line}'}: {field}: {message}")
        raise SpecError("; ".join(lines), error.problems) from None
