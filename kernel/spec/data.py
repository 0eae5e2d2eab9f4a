"""The prompts: DeepMath, a file (uploaded or under the data root), inline prompts, or the
arithmetic task; how questions become chat prompts; several datasets with their shares.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from kernel.model_names import ARITHMETIC_SUFFIX
from kernel.spec.base import Name, SpecModel, field_error

DEFAULT_QUESTION_SUFFIX = (
    "Please solve the problem step by step and put the final answer in \\boxed{}."
)
DEEPMATH_SHARDS = 10
MAX_SAMPLE_SIZE = 10_000_000
MAX_INLINE_PROMPTS = 10_000
MAX_PROMPT_CHARS = 100_000
SHUFFLE_SEED = "Shuffles the rows before `sample_size` are kept (and the held-out ones drawn)."
Turns = Literal["last", "each"]
"""Which assistant turns of a conversation are prompts: the last one, or each one."""


def require_source(schema: dict[str, Any]) -> None:
    """The dataset union tells its members apart by `source`, so a dataset that is given
    must name its source; the documented schema says so too (the default is for Python)."""
    schema["required"] = ["source", *schema.get("required", [])]


class PromptOptions(SpecModel):
    """How every source's questions become chat prompts; the base of every dataset source."""

    model_config = ConfigDict(json_schema_extra=require_source)

    question_suffix: str = Field(
        DEFAULT_QUESTION_SUFFIX,
        max_length=MAX_PROMPT_CHARS,
        description="Text after each question. Not given: the one the student's model was "
        "trained to read (the arithmetic presets and the arithmetic source: `Answer in "
        "\\boxed{}.`), else the reference's DeepMath line.",
    )
    enable_thinking: bool = Field(
        False,
        description="Passed to the chat template (Qwen3's thinking switch); templates without "
        "it ignore it.",
    )


class DeepMathDataset(PromptOptions):
    """DeepMath-103K parquet shards downloaded from ModelScope, as the reference does."""

    source: Literal["deepmath"] = Field("deepmath", description="Which source this is.")
    repo: str = Field(
        "AI-ModelScope/DeepMath-103K",
        pattern=r"^[\w.-]+/[\w.-]+$",
        description="The ModelScope dataset repository.",
    )
    revision: str = Field(
        "master", min_length=1, max_length=200, description="Its branch, tag or commit."
    )
    num_shards: int = Field(
        1, ge=1, le=DEEPMATH_SHARDS, description="Parquet shards downloaded, from the first."
    )
    sample_size: int | None = Field(
        1000, ge=1, le=MAX_SAMPLE_SIZE, description="Prompts kept after shuffling; null = all."
    )
    seed: int = Field(42, ge=0, le=2**31 - 1, description=SHUFFLE_SEED)


FILE_ID = r"^file-[1-9][0-9]{0,9}$"
BLOB = r"^[0-9a-f]{64}\.(jsonl|parquet|csv)$"


class FileDataset(PromptOptions):
    """A parquet, JSONL or CSV file: one the team uploaded (`file`, POST /v1/files), or one
    under the server's data root (`path`, relative paths resolve there; for operators). A
    table of questions, or conversations (OpenAI's fine-tuning format, TRL's conversational
    formats), told apart by the shape of its rows."""

    source: Literal["file"] = Field("file", description="Which source this is.")
    path: str | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="A file under the server's data root (OPD_DATA_ROOT; a relative path "
        "resolves there): for operators. A team names an uploaded `file` instead.",
    )
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
    field: str = Field(
        "question",
        min_length=1,
        max_length=200,
        description="The column of questions (with `file`: the one its upload found).",
    )
    answer_field: str | None = Field(
        None, min_length=1, max_length=200, description="The reference answers, for eval."
    )
    sample_size: int | None = Field(
        None, ge=1, le=MAX_SAMPLE_SIZE, description="Rows kept after shuffling; null = all."
    )
    seed: int = Field(42, ge=0, le=2**31 - 1, description=SHUFFLE_SEED)
    turns: Turns = Field(
        "last",
        description="A file of conversations: the prompts each gives. `last`: the messages "
        "before its last assistant turn trained on (OpenAI's weight 1, the default), that "
        "turn the reference answer; `each`: one such prompt for every such turn. A "
        "conversation that ends with a user's turn is a prompt as a whole. The question "
        "suffix is not added to conversations.",
    )

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

    source: Literal["inline"] = Field("inline", description="Which source this is.")
    prompts: list[Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]] = Field(
        min_length=1,
        max_length=MAX_INLINE_PROMPTS,
        description="The questions, used in this order (each step takes the next ones).",
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
MAX_OPERAND_DIGITS = 3


def operand_count(digits: int) -> int:
    """How many operands of `digits` digits there are (1 digit: 0..9; else no leading 0)."""
    return 10 if digits == 1 else 9 * 10 ** (digits - 1)


class ArithmeticDataset(PromptOptions):
    """Generated problems such as "What is 47 + 38?", with their answers: a task small
    models learn on a CPU, for demos and benchmarks that show a student getting better."""

    source: Literal["arithmetic"] = Field("arithmetic", description="Which source this is.")
    question_suffix: str = Field(
        ARITHMETIC_SUFFIX,
        max_length=MAX_PROMPT_CHARS,
        description="Text after each question: the arithmetic presets learned to read this one.",
    )
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
    seed: int = Field(42, ge=0, le=2**31 - 1, description="Draws the problems (and their order).")

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


MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
MAX_STORED_ROWS = 5000
"""The most stored completions one dataset reads (their conversations are in the spec)."""
STORED_ID = r"^(chatcmpl|cmpl)-[0-9a-f]{32}$"


def bounded_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """OpenAI's bounds: at most 16 pairs, keys of 1 to 64 characters, values of 512."""
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ValueError(f"at most {MAX_METADATA_PAIRS} pairs ({len(metadata)} given)")
    for key, value in metadata.items():
        if not key or len(key) > MAX_METADATA_KEY:
            raise ValueError(f"key {key[:80]!r}: 1 to {MAX_METADATA_KEY} characters")
        if len(value) > MAX_METADATA_VALUE:
            raise ValueError(f"the value of {key!r}: at most {MAX_METADATA_VALUE} characters")
    return metadata


Metadata = Annotated[
    dict[str, str],
    AfterValidator(bounded_metadata),
    Field(description="Up to 16 string pairs (keys up to 64 characters, values up to 512)."),
]
"""A stored completion's labels, as OpenAI bounds them."""
Rating = Literal[-1, 0, 1]
"""Feedback's rating of a stored completion: -1 bad, 0 neutral, 1 good."""


class StoredCompletionFilter(SpecModel):
    """Which of the team's stored chat completions: every condition given holds."""

    model: str | None = Field(
        None, max_length=64, description="The model the request named, e.g. job-12."
    )
    metadata: Metadata = Field(
        default_factory=dict, description="Pairs the completion's metadata holds, each exactly."
    )
    rating: Rating | None = Field(None, description="Some feedback on it gave this rating.")
    has_feedback: bool | None = Field(
        None, description="true: some feedback on it; false: none; null: either."
    )
    since: datetime | None = Field(None, description="Stored at or after this time.")
    until: datetime | None = Field(None, description="Stored before this time.")
    limit: int = Field(
        1000,
        ge=1,
        le=MAX_STORED_ROWS,
        description="The most completions read: the newest that match.",
    )


class StoredRow(SpecModel):
    """One stored completion as a job reads it (filled by the service)."""

    id: str = Field(pattern=STORED_ID, description="The stored completion's id.")
    messages: list[dict[str, Any]] = Field(
        min_length=1, description="The conversation up to the answered turn."
    )
    tools: list[dict[str, Any]] | None = Field(None, description="The tools it offered.")
    answer: str = Field(description="The answer served (the row's reference answer).")
    feedback: list[str] = Field(
        default_factory=list, description="The corrections and notes given on it, oldest first."
    )


class StoredCompletionsDataset(PromptOptions):
    """The team's stored chat completions (`store: true` on /v1/chat/completions): each
    one's conversation up to the answered turn is a prompt, the answer served its
    reference, and the corrections given on it (POST /v1/chat/completions/{id}/feedback)
    what a `teacher.self` with `context: feedback` reads. The service reads the rows the
    filter picks when the job is submitted and records their ids, so that a clone reads
    the same rows."""

    source: Literal["stored_completions"] = Field(
        "stored_completions", description="Which source this is."
    )
    filter: StoredCompletionFilter = Field(
        default_factory=StoredCompletionFilter, description="Which stored completions."
    )
    ids: list[Annotated[str, Field(pattern=STORED_ID)]] | None = Field(
        None,
        max_length=MAX_STORED_ROWS,
        description="The completions read: filled by the service from the filter; given (a "
        "clone's), exactly these are read again.",
    )
    rows: list[StoredRow] | None = Field(
        None,
        description="Filled by the service from ids: each completion as read; refused if given.",
    )


DatasetSpec = Annotated[
    DeepMathDataset | FileDataset | InlineDataset | ArithmeticDataset | StoredCompletionsDataset,
    Field(discriminator="source"),
]


class DatasetShare(SpecModel):
    """What a dataset under `datasets:` adds to its source: a name, its share of each
    step's prompts and, with teacher_mixture: route, the teacher that scores them."""

    name: Name = Field(
        description="What its metrics end in (`opd/reverse_kl_mean/<name>`) and its rows say."
    )
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


class SharedStoredCompletions(StoredCompletionsDataset, DatasetShare):
    pass


SharedDataset = Annotated[
    SharedDeepMath | SharedFile | SharedInline | SharedArithmetic | SharedStoredCompletions,
    Field(discriminator="source"),
]


MAX_DATASETS = 16
SINGLE_DATASET = "dataset"


def named(dataset: DatasetSpec, name: str) -> SharedDataset:
    """A dataset as one of several, with a name (weight 1, no teacher of its own)."""
    shared = {
        DeepMathDataset: SharedDeepMath,
        FileDataset: SharedFile,
        InlineDataset: SharedInline,
        ArithmeticDataset: SharedArithmetic,
        StoredCompletionsDataset: SharedStoredCompletions,
    }[type(dataset)]
    return shared.model_construct(**dict(dataset), name=name)
