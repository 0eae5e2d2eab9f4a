"""The job spec: every group in one model, and the rules that span groups (teachers and
datasets that fit each other, an objective its backend and teachers can train).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from kernel.model_names import PRESET_LEARNING_RATES, PRESET_QUESTION_SUFFIXES, preset_tokenizer
from kernel.spec.backends import LocalBackendSpec, TinkerBackendSpec, TrioBackendSpec
from kernel.spec.base import Name, SpecModel, field_error
from kernel.spec.data import (
    MAX_DATASETS,
    SINGLE_DATASET,
    DatasetShare,
    DatasetSpec,
    DeepMathDataset,
    FileDataset,
    InlineDataset,
    PromptOptions,
    SharedDataset,
    StoredCompletionsDataset,
    named,
)
from kernel.spec.eval import EvalSpec
from kernel.spec.loop import LoopSpec, described
from kernel.spec.optim import OptimSpec
from kernel.spec.sampling import SamplingSpec
from kernel.spec.student import StudentSpec
from kernel.spec.teachers import (
    MAX_TEACHERS,
    SELF_BASE_MODEL,
    SINGLE_TEACHER,
    MixedTeacher,
    TeacherSpec,
)
from kernel.spec.trackers import SwanLabSpec, TrackersSpec

MAX_METADATA_KEYS = 32
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 1024
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


def without_answers(dataset: DatasetSpec | SharedDataset) -> str | None:
    """How to give a dataset's prompts their reference answers when it has none, else
    None (the worker checks that no single answer is missing)."""
    if isinstance(dataset, InlineDataset) and dataset.answers is None:
        return "give its answers"
    if isinstance(dataset, FileDataset) and dataset.answer_field is None:
        return "name its answer column in answer_field"
    return None


def the_students_model_for_self_teachers(data: dict[str, Any]) -> dict[str, Any]:
    """A self teacher's base_model is the student's: filled in when left out, so that the
    stored spec names (and prices) the model it scores with."""
    student = data.get("student")
    model = student.get("base_model") if isinstance(student, dict) else None
    model = getattr(student, "base_model", model)
    if not isinstance(model, str):
        return data

    def filled(teacher: Any) -> Any:
        if isinstance(teacher, TeacherSpec):
            unfilled = teacher.self is not None and teacher.base_model == SELF_BASE_MODEL
            return teacher.model_copy(update={"base_model": model}) if unfilled else teacher
        unfilled = isinstance(teacher, dict) and teacher.get("self") is not None
        if unfilled and teacher.get("base_model") in (None, SELF_BASE_MODEL):
            return {**teacher, "base_model": model}
        return teacher

    data = dict(data)
    if "teacher" in data:
        data["teacher"] = filled(data["teacher"])
    if isinstance(data.get("teachers"), dict):
        data["teachers"] = {name: filled(t) for name, t in data["teachers"].items()}
    return data


def not_a_job_name(alias: str) -> str:
    if alias.startswith("job-"):
        raise ValueError("an alias may not start with job- (the names of jobs' models)")
    return alias


Alias = Annotated[
    str,
    Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$"),
    AfterValidator(not_a_job_name),
]
"""What a team calls the newest succeeded job of a lineage on the completions doors."""


class JobSpec(SpecModel):
    """Everything one OPD run needs; the public contract of the service. What it trains
    (backend, student, teacher(s), dataset(s)) is always written; the algorithm's settings
    default to the reference's."""

    model_config = ConfigDict(json_schema_extra=one_of_each_required)

    name: Name = Field(
        "opd-deepmath-qwen35-4b",
        description="What lists and pages call the job (not unique); the saved weights' "
        "default name.",
    )
    backend: Literal["local", "trio", "tinker"] = Field(
        description="What trains: `local` (PyTorch in the worker, CPU or GPU), `trio` "
        "(PyTRIO's service, PYTRIO_API_KEY) or `tinker` (Tinker's, TINKER_API_KEY)."
    )
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
    metadata: Metadata = Field(
        default_factory=dict,
        description="Free string labels (`opd jobs --metadata key=value` and the API's "
        "`metadata` filter find jobs by them).",
    )
    alias: Alias | None = Field(
        None,
        description="A name the team's OpenAI-compatible doors serve the job's final weights "
        "under once it succeeds (`model: support-bot`), until a newer succeeded job of the "
        "team with the same alias takes the name over (a clone keeps it: retrained weights "
        "serve where the old ones did). Lowercase letters, digits, `.`, `_`, `-`; not "
        "`job-...`. Ignored by `opd run`.",
    )
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
        return the_students_model_for_self_teachers(data)

    @property
    def weights_name(self) -> str:
        """What the job's weights and states are saved as: `loop.save_weights_name`, else
        the job's name (left unset, a clone that renames the job renames its weights)."""
        return self.loop.save_weights_name or self.name

    @model_validator(mode="after")
    def _defaults_follow_the_student(self) -> JobSpec:
        """What a spec leaves out follows its student where the student is a preset: the
        question suffix its model was trained to read, and a learning rate it learns with
        on the local backend. A stored spec holds every field, so it keeps what it got."""
        student = self.student.base_model
        suffix = PRESET_QUESTION_SUFFIXES.get(student)
        for options in self.prompt_options():
            if suffix is not None and "question_suffix" not in options.model_fields_set:
                options.question_suffix = suffix
        if "learning_rate" not in self.optim.model_fields_set:
            self.optim.learning_rate = self.default_learning_rate()
        return self

    def default_learning_rate(self) -> float:
        """The learning rate a spec that gives none gets: its preset student's on the local
        backend, else the reference's."""
        rate = PRESET_LEARNING_RATES.get(self.student.base_model)
        if self.backend == "local" and rate:
            return rate
        return float(OptimSpec.model_fields["learning_rate"].default)

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
        self._self_teachers_fit()
        self._objective_fits_the_backend()
        self._sampling_engine_fits()
        self._sampler_fits_the_advantage()
        self._servers_fit_the_objective()
        self._objective_fits_the_tokenizers()
        return self

    def _sampling_engine_fits(self) -> None:
        """vLLM samples the local backend's student (it loads the adapters that backend
        saves). A self teacher then scores on the server too, which answers each token's
        logprob; under a logit-level objective the trainer reads the teacher's whole
        distribution itself: the base weights (its adapter off) it holds, but not the
        weights of a sampler on vLLM (`current`)."""
        if self.sampling.engine == "local":
            return
        if self.backend != "local":
            raise field_error(
                ("sampling", "engine"), "vllm samples for the local backend only; use local"
            )
        if self.trainer_scores() and any(
            teacher.self is not None and teacher.self.weights == "current"
            for teacher in self.teacher_specs().values()
        ):
            raise field_error(
                ("sampling", "engine"),
                f"objective {described(self.loop.objective)} reads a self teacher's whole "
                "distribution in the trainer, which holds no weights of a sampler on vllm: "
                "use the self teacher's weights base, objective sampled_reverse_kl, or "
                "engine local",
            )

    def _sampler_fits_the_advantage(self) -> None:
        """sampled_reverse_kl's advantage subtracts the sampler's logprob of each token,
        which samplers report over the whole distribution (vLLM's raw logprobs, and this
        service's), while top_p and top_k sample from the kept tokens alone: the reverse KL
        and the importance ratio would both be off, every step, by the mass cut away. And
        the ratio's bound (`loop.sampler_correction`) gates the loss where it is computed:
        the local backend's trainer; PyTRIO's and Tinker's compute theirs on their servers."""
        loop, sampling = self.loop, self.sampling
        if not loop.objective.logit_level and (sampling.top_p < 1 or sampling.top_k > 0):
            at = ("sampling", "top_p" if sampling.top_p < 1 else "top_k")
            raise field_error(
                at,
                "objective sampled_reverse_kl subtracts the sampler's logprob of each token, "
                "which is its logprob over the whole vocabulary, while top_p and top_k sample "
                "from the tokens they keep: the reverse KL and the importance ratio would be "
                "off by the probability cut away. Use top_p 1 and top_k -1, or a logit-level "
                "objective (reverse_kl, forward_kl, jsd), which compares whole distributions",
            )
        if loop.sampler_correction.active and self.backend != "local":
            raise field_error(
                ("loop", "sampler_correction", "kind"),
                f"backend {self.backend} computes the loss on its own servers, which take no "
                "bound on the trainer/sampler ratio: use none (loss_fn ppo or cispo clip the "
                "same ratio there), or the local backend",
            )

    def _self_teachers_fit(self) -> None:
        """A self teacher is the student's own model, and one that reads the reference
        answer needs prompts that have one."""
        for name, teacher in self.teacher_specs().items():
            if teacher.self is None:
                continue
            at = tuple(self.teacher_field(name).split("."))
            if teacher.base_model != self.student.base_model:
                raise field_error(
                    (*at, "base_model"),
                    "a self teacher is the student's own model: leave base_model out (it is "
                    f"student.base_model, {self.student.base_model!r})",
                )
            if not teacher.self.reference:
                continue
            for field, dataset in self.datasets_scored_by(name):
                if hint := without_answers(dataset):
                    raise field_error(
                        (*at, "self", "reference"),
                        f"the teacher reads each prompt's reference answer, and {field} "
                        f"({dataset.source}) has none: {hint}",
                    )

    def datasets_scored_by(self, name: str) -> list[tuple[str, DatasetSpec | SharedDataset]]:
        """(field, dataset) of each dataset whose prompts teacher `name` scores: those
        routed to it (all of them under mixture), and the eval's own."""
        scored: list[tuple[str, DatasetSpec | SharedDataset]] = [
            ("dataset" if self.datasets is None else f"datasets.{index}", share)
            for index, share in enumerate(self.dataset_shares())
            if self.route_of(share) in (name, None)
        ]
        if self.eval is not None and self.eval.dataset is not None:
            scored.append(("eval.dataset", self.eval.dataset))
        return scored

    def _objective_fits_the_tokenizers(self) -> None:
        """A logit-level objective compares two distributions position by position: with a
        teacher whose tokenizer is visibly another (presets of the local backend; any other
        model's the worker's preflight reads), over the next byte of the text
        (docs/concepts/objectives.md#across-tokenizers), which a mixture of teachers cannot
        share (each teacher's token boundaries fall elsewhere)."""
        if not self.loop.objective.logit_level or self.backend != "local":
            return
        if self.teacher_mixture != "mixture" or len(self.teacher_specs()) < 2:
            return
        student = preset_tokenizer(self.student.base_model)
        for name, teacher in self.teacher_specs().items():
            theirs = preset_tokenizer(teacher.base_model)
            if student is not None and theirs is not None and theirs != student:
                raise field_error(
                    ("teacher_mixture",),
                    f"{self.teacher_field(name)} {teacher.base_model!r} has another tokenizer "
                    f"({theirs}, the student's is {student}): objective "
                    f"{self.loop.objective.kind} compares it with the student over the next "
                    "byte, which a mixture of teachers cannot share; use teacher_mixture: "
                    "route, or objective sampled_reverse_kl",
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

    def readers(self) -> int:
        """Teachers that score each completion: every one of a mixture, else one."""
        return len(self.teacher_specs()) if self.teacher_mixture == "mixture" else 1

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

    def written_datasets(self) -> list[tuple[str, Any]]:
        """Each dataset the spec reads, by where it is written (`dataset`, `datasets.1`,
        `eval.dataset`)."""
        read: list[tuple[str, Any]] = [
            (f"datasets.{i}", share) for i, share in enumerate(self.datasets or [])
        ]
        if self.datasets is None:
            read.append(("dataset", self.dataset))
        read.append(("eval.dataset", self.eval and self.eval.dataset))
        return read

    def file_datasets(self) -> list[tuple[str, FileDataset]]:
        """Each file dataset the spec reads, by where it is written."""
        return [(at, d) for at, d in self.written_datasets() if isinstance(d, FileDataset)]

    def stored_datasets(self) -> list[tuple[str, StoredCompletionsDataset]]:
        """Each dataset of stored completions the spec reads, by where it is written."""
        return [
            (at, d) for at, d in self.written_datasets() if isinstance(d, StoredCompletionsDataset)
        ]

    def dataset_files(self) -> list[tuple[str, str]]:
        """(field, path) of each dataset file the spec reads by path (`dataset.path`,
        `datasets.1.path`, `eval.dataset.path`): the service confines them all."""
        return [(f"{at}.path", d.path) for at, d in self.file_datasets() if d.path is not None]

    def uploaded_files(self) -> set[str]:
        """The ids of the uploaded files the spec reads."""
        return {d.file for _, d in self.file_datasets() if d.file is not None}

    def with_dataset(self, at: str, dataset: FileDataset | StoredCompletionsDataset) -> JobSpec:
        """The spec with the dataset written at `at` (as `written_datasets` names it)
        replaced by `dataset` (filled in by the service)."""
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

    def prompt_options(self) -> list[PromptOptions]:
        """Every dataset the spec renders prompts from, as written: `dataset` (or each of
        `datasets`) and `eval.dataset`."""
        written: list[Any] = list(self.datasets) if self.datasets is not None else [self.dataset]
        if self.eval is not None and self.eval.dataset is not None:
            written.append(self.eval.dataset)
        return written

    def several_datasets(self) -> bool:
        """Whether per-dataset metrics (ending in `/<dataset>`) are recorded."""
        return self.datasets is not None
