"""The loop and its objective: steps, batch and group sizes, the loss and its options, the
objective (sampled reverse KL, or a logit-level one), the reward, off-policy steps and
checkpoints.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from kernel.spec.base import MAX_STEPS, Name, SpecModel, field_error

MAX_BATCH_SIZE = 1024
MAX_GROUP_SIZE = 256
MAX_STEPS_OFF_POLICY = 8
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


class NamedByKind(SpecModel):
    """A group its kind's name alone may stand for: `objective: jsd` is
    `objective: {kind: jsd}`, `sampler_correction: mask` is `{kind: mask}`."""

    @model_validator(mode="before")
    @classmethod
    def _a_name_alone(cls, data: Any) -> Any:
        return {"kind": data} if isinstance(data, str) else data


class ObjectiveSpec(NamedByKind):
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


CorrectionName = Literal["none", "truncate", "mask"]


class SamplerCorrectionSpec(NamedByKind):
    """What a step does with a completion token whose trainer and sampler disagree: the
    ratio of the trainer's probability of the token (its forward pass before the update) to
    the sampler's, which a sampler of another engine (vLLM, bf16) moves away from 1, bounded
    to [1/c, c] as TRL's `distillation_is_clip` and NeMo-RL's gate bound it
    (docs/concepts/objectives.md#when-the-sampler-disagrees)."""

    kind: CorrectionName = Field(
        "none",
        description="none: every token trains as it came (the reference); truncate: a token "
        "outside the bound trains with its ratio clipped to it (truncated importance "
        "sampling); mask: a token outside the bound does not train.",
    )
    c: float = Field(
        2.0,
        gt=1.0,
        le=100.0,
        description="The bound: tokens whose trainer/sampler probability ratio lies outside "
        "[1/c, c] are truncated or masked.",
    )

    @property
    def active(self) -> bool:
        return self.kind != "none"


ColdStartSource = Literal["teacher", "reference"]


class ColdStartSpec(SpecModel):
    """The first steps train on completions the student did not sample, with the job's own
    objective: the teacher's answers (GOLD's off-policy share, its `lmbda`) or the
    dataset's reference answers, as the student's tokens. A student that cannot yet write
    in its teacher's format (a `\\boxed{}` it never writes, a template it never saw) learns
    it there first, then learns on-policy what the teacher knows."""

    steps: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="The first N steps train on these completions instead of the student's "
        "own; 0 = none (on-policy from the first step, the reference).",
    )
    source: ColdStartSource = Field(
        "teacher",
        description="teacher: each prompt's teacher answers it (group_size samples, from its "
        "own rendering, at the job's sampling settings), its text re-tokenised for the "
        "student; reference: the dataset's reference answer, once per prompt.",
    )


class LoopSpec(SpecModel):
    steps: int = Field(
        10,
        ge=1,
        le=MAX_STEPS,
        description="Optimizer steps: one forward_backward and optim_step each.",
    )
    batch_size: int = Field(
        2,
        ge=1,
        le=MAX_BATCH_SIZE,
        description="Prompts a step takes from the shuffled pool, in order, wrapping around.",
    )
    group_size: int = Field(
        2,
        ge=1,
        le=MAX_GROUP_SIZE,
        description="Completions the student samples of each prompt: a step trains on "
        "batch_size x group_size of them.",
    )
    kl_penalty_coef: float = Field(
        1.0,
        ge=0.0,
        le=1000.0,
        description="Each token's advantage is minus this times its reverse KL (student "
        "logprob minus teacher logprob): how hard a step pulls toward the teacher.",
    )
    kl_discount_factor: float = Field(
        0.0, ge=0.0, le=1.0, description="0 = the reference (per-token advantage only)."
    )
    loss_fn: LossName = Field(
        "importance_sampling",
        description="The policy losses that make sense for OPD datums (cross_entropy does "
        "not: their prompt targets are 0 and they carry no weights).",
    )
    loss_fn_config: LossConfig = Field(default_factory=LossConfig)
    sampler_refresh_steps: int = Field(
        1,
        ge=1,
        le=MAX_STEPS,
        description="Steps between new sampler weights (1: every step samples from the "
        "latest weights, on-policy, as the reference does).",
    )
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
    cold_start: ColdStartSpec = Field(
        default_factory=ColdStartSpec,
        description="Off-policy first steps on the teacher's or the dataset's answers "
        "(docs/concepts/objectives.md#a-cold-start).",
    )
    sampler_correction: SamplerCorrectionSpec = Field(
        default_factory=SamplerCorrectionSpec,
        description="Tokens whose trainer/sampler probability ratio is out of bounds: "
        "truncated, masked or trained as they came (none, the reference).",
    )
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
        if self.sampler_correction.active:
            raise field_error(
                ("sampler_correction", "kind"),
                f"objective {kind} compares the trainer's own distribution with the "
                "teacher's at each position, so no sampler's logprob enters it: use none, or "
                "objective sampled_reverse_kl",
            )
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


def described(objective: ObjectiveSpec) -> str:
    """An objective as messages name it: its kind, its top-k and its tail."""
    if not objective.top_k:
        return f"{objective.kind} over the full vocabulary"
    tail = "with" if objective.keeps_tail else "without"
    return f"{objective.kind} over the top {objective.top_k} tokens {tail} a tail bucket"
