"""Every metric a job records, by the name people chart, with what it is: the documentation's
metric reference is generated from it, and a test runs jobs and checks that they record
nothing that is not listed here. Names are part of the interface: add, never rename.

A name may hold a placeholder: `<dataset>` and `<teacher>` (the names a spec gives them, with
several), `<phase>` (a step's phases), `<name>` (a backend's own metric), `<k>` (the eval's
samples per prompt), `<replica>` (a teacher tier's replica, by its number from 1).
"""

from __future__ import annotations

import re
from functools import cache

REVERSE_KL = "opd/reverse_kl_mean"
"""The curve OPD drives down: what progress bars and charts show first."""
STEP_PHASES = ("sampler_refresh", "sample", "teacher", "rollout_wait", "train", "save")
"""Where a step's time goes: its `time/<phase>` metrics, in the order they are listed (the
eval's, `time/eval`, is recorded with the eval)."""

METRICS: dict[str, str] = {
    "data/datums": "Datums trained on in the step (one per completion with tokens).",
    "data/datums/<dataset>": "Of them, those of one dataset (with several).",
    "data/completion_tokens_mean": "Mean tokens per sampled completion.",
    "data/completion_tokens_total": "Tokens sampled in the step.",
    "data/completion_tokens_per_second": "Tokens sampled per second of the step's wall time.",
    "opd/reverse_kl_mean": "Mean per-token reverse KL, student logprob minus teacher logprob, "
    "over the step's completion tokens (the curve OPD drives down).",
    "opd/reverse_kl_mean/<dataset>": "The same over one dataset's completions.",
    "opd/reverse_kl_std": "Its standard deviation over the step's tokens.",
    "opd/objective_mean": "A logit-level objective's value per completion position.",
    "opd/teacher_mass_mean": "With a top-k objective: the teacher's probability mass its top k "
    "tokens hold, per position.",
    "opd/aligned_bytes_fraction": "With a teacher of another tokenizer: the fraction of the "
    "step's completion bytes its tokens aligned with the student's.",
    "opd/aligned_bytes_fraction/<teacher>": "The same for one such teacher (with several).",
    "opd/sampler_logprob_diff_mean": "With a sampler of another engine (sampling.engine: "
    "vllm) or loop.sampler_correction: the mean absolute difference between the sampler's "
    "logprob of each completion token and the trainer's.",
    "opd/sampler_logprob_diff_max": "The largest such difference in the step.",
    "opd/sampler_ratio_outside_fraction": "The fraction of the step's completion tokens whose "
    "trainer/sampler probability ratio lies outside [1/c, c] (loop.sampler_correction): "
    "those truncated or masked, or with none trained as they came.",
    "train/learning_rate": "The optimiser's learning rate.",
    "train/step": "The step's index (from 0).",
    "train/staleness_mean": "Mean optimizer steps between the weights that sampled a rollout "
    "and the weights it trains (0 on-policy; up to loop.max_steps_off_policy).",
    "train/staleness_max": "The largest such staleness in the step.",
    "time/step_elapsed_time": "Seconds the step took, end to end.",
    "time/<phase>": "Seconds of the step spent in one phase: sampler_refresh, sample, teacher, "
    "rollout_wait, train, save (the checkpoint before it), eval.",
    "time/teacher_wait": "With teachers on inference servers: seconds since the step before in "
    "which the job had requests outstanding there (queued or in flight), over all of them.",
    "teacher/replica_share/<teacher>/<replica>": "With a teacher tier (OPD_TEACHER_REPLICAS): "
    "the share of the teacher's requests since the step before that its replica n (from 1, "
    "in the operator's order) answered.",
    "usage/sampled_tokens": "Tokens the student sampled.",
    "usage/trained_tokens": "Tokens of the step's datums (each prompt + completion[:-1]).",
    "usage/teacher_tokens": "Tokens the teachers read to score (each its own prompt and the "
    "completion).",
    "usage/teacher_tokens/<teacher>": "The same for one teacher (with several).",
    "usage/eval_tokens": "Tokens the step's eval sampled and scored.",
    "trainer/<name>": "What the backend's forward_backward reports (loss_sum, loss_mean, "
    "token_count; PyTRIO and Tinker their own).",
    "reward/mean": "With loop.reward: the mean verifiable reward of the step's completions.",
    "reward/mean/<dataset>": "The same over one dataset's completions.",
    "eval/reverse_kl_mean": "Held-out: the student's mean reverse KL to its teachers.",
    "eval/completion_tokens_mean": "Held-out: mean tokens per completion.",
    "eval/truncated_fraction": "Held-out: the fraction of completions cut at max_tokens.",
    "eval/accuracy": "Held-out: the fraction of completions graded right.",
    "eval/pass@<k>": "Held-out, with several samples per prompt: the fraction of prompts with "
    "at least one right answer.",
    "eval/teacher_completion_tokens_mean": "The teacher's baseline (step 0): mean tokens.",
    "eval/teacher_truncated_fraction": "The teacher's baseline: the fraction truncated.",
    "eval/teacher_accuracy": "The teacher's baseline: the fraction right.",
    "eval/teacher_pass@<k>": "The teacher's baseline: pass@k.",
    "eval/<metric>/<dataset>": "With several datasets: each eval figure above over one "
    "dataset's held-out prompts.",
}

PLACEHOLDERS = {
    "<dataset>": r"[^/]+",
    "<teacher>": r"[^/]+",
    "<name>": r"[^/]+",
    "<k>": r"[0-9]+",
    "<phase>": "(?:" + "|".join((*STEP_PHASES, "eval")) + ")",
    "<metric>": r"[^/]+",
    "<replica>": r"[0-9]+",
}


@cache
def patterns() -> tuple[re.Pattern[str], ...]:
    compiled = []
    for name in METRICS:
        regex = re.escape(name)
        for placeholder, part in PLACEHOLDERS.items():
            regex = regex.replace(re.escape(placeholder), part)
        compiled.append(re.compile(f"^{regex}$"))
    return tuple(compiled)


def documented(name: str) -> bool:
    """Whether a recorded metric's name is one `METRICS` lists."""
    return any(pattern.match(name) for pattern in patterns())
