"""A spec's estimate (`POST /v1/jobs/estimate`): admitted like a job, nothing stored, its
counts from the spec and its lengths from what the service has seen.

The point estimate takes its lengths from the team's earlier jobs that succeeded with the
same student, teachers and dataset (their recorded tokens divided by their counts, which
their specs fix); without one, from the spec alone, and says so. The bounds are those of
completions that stop at their first token and completions that run to max_tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.budgets.counts import Lengths, Shape, Span, Tokens, eval_boundaries, tokens
from app.budgets.rules import left
from app.budgets.schemas import BudgetFit, CostSpan, Estimate, TokenSpan
from app.budgets.service import standing
from app.core.config import Settings
from app.core.pricing import PriceTable
from app.files.errors import FileNotFound
from app.files.schemas import FileReport, row_id
from app.files.store import get_file
from app.jobs.admission import admit
from app.jobs.schemas import JobStatus
from app.jobs.tables import Job
from app.usage.store import models_of
from kernel.model_names import preset_tokenizer, text_tokens
from kernel.spec import JobSpec, stored_spec
from kernel.spec.data import ArithmeticDataset, FileDataset, InlineDataset

HISTORY_SCAN = 200
"""The team's latest jobs looked through for earlier runs like the one estimated."""
HISTORY_JOBS = 5
"""Of those, the most recent alike that the point estimate averages."""
TEMPLATE_TOKENS = Span(0, 16, 64)
"""What a chat template adds to a prompt, without a job that measured it."""
BYTES_PER_TOKEN = 4
"""A prompt's bytes per token for the point estimate without history (tokens are at most
one a byte, the high bound's assumption)."""
CROSS_RATE_BYTES = Span(1 / 8, 1 / 4, 1)
CROSS_RATE = Span(1 / 8, 1, 8)
"""Another tokenizer's tokens per student token, unknown but for the byte-level students."""
UNKNOWN_PROMPT = Span(1, 128, 4096)
"""A prompt nobody measured whose text the spec does not hold (a file, DeepMath)."""
PROMPT_SPREAD = 0.1
"""How far the mean prompt of a new sample of the same dataset may lie from the one
earlier jobs measured, for the bounds."""
UNKNOWN_EVAL_PROMPTS = 100
"""Eval prompts of an eval dataset whose size the spec does not fix."""


def prompt_count(dataset: Any) -> int | None:
    """How many prompts a dataset holds, where its spec says."""
    for field in ("prompts", "sample_size", "count"):
        value = getattr(dataset, field, None)
        if value is not None:
            return len(value) if isinstance(value, list) else int(value)
    return None


def eval_prompts(spec: JobSpec) -> tuple[int, bool]:
    """An eval's prompts, and whether the spec fixes how many."""
    if spec.eval is None:
        return 0, True
    if spec.eval.holdout:
        return spec.eval.holdout * len(spec.dataset_shares()), True
    count = prompt_count(spec.eval.dataset)
    return (UNKNOWN_EVAL_PROMPTS, False) if count is None else (count, True)


def shape_of(spec: JobSpec) -> Shape:
    """The counts the spec fixes."""
    loop = spec.loop
    prompts, _ = eval_prompts(spec)
    samples = spec.eval.samples_per_prompt if spec.eval else 0
    return Shape(
        steps=loop.steps,
        completions_per_step=loop.batch_size * loop.group_size,
        readers=spec.readers(),
        evals=eval_boundaries(loop.steps, spec.eval.every) if spec.eval else 0,
        eval_completions=prompts * samples,
        baseline=bool(spec.eval and spec.eval.teacher_baseline),
    )


def max_eval_tokens(spec: JobSpec) -> int:
    return (spec.eval and spec.eval.max_tokens) or spec.sampling.max_tokens


def alike(spec: JobSpec) -> str:
    """What two jobs share when their lengths carry over: student, teachers, datasets."""
    data = spec.model_dump(mode="json", include={"student", "teacher", "teachers", "dataset"})
    data["datasets"] = spec.model_dump(mode="json", include={"datasets"}).get("datasets")
    data["student"] = data["student"]["base_model"]
    data["enable_thinking"] = spec.dataset_shares()[0].enable_thinking
    return json.dumps(data, sort_keys=True)


@dataclass(frozen=True)
class Measured:
    """Lengths one earlier job measured, per completion, and how many completions."""

    job_id: int
    completions: int
    completion: float
    prompt: float
    teacher_prompt: float
    eval_completion: float | None


def measured(job: Job, spec: JobSpec) -> Measured | None:
    """The lengths job `job` (of spec `spec`, succeeded) used, from its token totals."""
    shape = shape_of(spec)
    done = shape.steps * shape.completions_per_step
    if not done or not job.sampled_tokens:
        return None
    completion = job.sampled_tokens / done
    prompt = job.trained_tokens / done - completion + 1
    teacher_prompt = max(job.teacher_tokens / (done * shape.readers) - completion, 0.0)
    eval_completion = None
    if shape.eval_completions and job.eval_tokens:
        # eval / E = c_e (n (1 + R) + 2 b) + teacher_prompt (n R + b): counts.tokens solved
        # for the eval completion's length c_e (the baseline's taken alike).
        n, r, b = shape.evals, shape.readers, int(shape.baseline)
        per_completion = job.eval_tokens / shape.eval_completions
        eval_completion = (per_completion - teacher_prompt * (n * r + b)) / (n * (1 + r) + 2 * b)
    assert job.id is not None
    return Measured(job.id, done, completion, prompt, teacher_prompt, eval_completion)


async def history(
    session: AsyncSession, team_id: int, spec: JobSpec, before: int | None = None
) -> list[Measured]:
    """The most recent of the team's succeeded jobs alike `spec` (created before job
    `before`, if given), measured."""
    query = select(Job).where(Job.team_id == team_id, Job.status == JobStatus.succeeded)
    if before is not None:
        query = query.where(Job.id < before)
    rows = await session.execute(query.order_by(Job.id.desc()).limit(HISTORY_SCAN))
    wanted, found = alike(spec), []
    for job in rows.scalars():
        try:
            earlier = stored_spec(job.spec)
        except ValueError:  # a spec an older service stored, that no longer parses
            continue
        if alike(earlier) == wanted and (lengths := measured(job, earlier)) is not None:
            found.append(lengths)
        if len(found) == HISTORY_JOBS:
            break
    return found


FileQuestions = Mapping[str, FileReport]
"""The reports of the uploaded files a spec reads, by file id."""


def question_bytes(spec: JobSpec, files: FileQuestions) -> Span | None:
    """The bytes of a training question with its suffix, where the spec holds the text or
    an uploaded file's report measured it (each question counted once)."""
    shortest, longest, total, count = float("inf"), 0.0, 0.0, 0
    for share in spec.dataset_shares():
        suffix = len(share.question_suffix.encode()) + 2 if share.question_suffix else 0
        sizes: list[tuple[float, float, float, int]] = []
        report = files.get(share.file) if isinstance(share, FileDataset) and share.file else None
        if isinstance(share, InlineDataset):
            sizes = [
                (size, size, size, 1) for size in (len(p.strip().encode()) for p in share.prompts)
            ]
        elif isinstance(share, ArithmeticDataset):
            digits = max(share.digits, share.multiplier_digits)
            question = len("What is  + ?")  # and the operands' digits
            sizes = [(q, q, q, 1) for q in (question + 2, question + 2 * digits)]
        elif report is not None and report.question_bytes is not None:
            lengths, rows = report.question_bytes, report.rows - report.empty_questions
            sizes = [(lengths.shortest, lengths.mean, lengths.longest, rows)]
        else:
            return None
        for low, point, high, weight in sizes:
            shortest, longest = min(shortest, low + suffix), max(longest, high + suffix)
            total, count = total + (point + suffix) * weight, count + weight
    return Span(shortest, total / count, longest)


def cold_prompt(spec: JobSpec, model: str, files: FileQuestions) -> tuple[Span, str]:
    """A prompt's length without history: from its text where the spec holds it (or an
    uploaded file's report measured it), in the tokens of `model` where its tokenizer says
    how many (the byte-level presets'), else at about BYTES_PER_TOKEN bytes a token."""
    text = question_bytes(spec, files)
    if text is None:
        return UNKNOWN_PROMPT, (
            "prompt length: not measured yet and not in the spec: assumed "
            f"{UNKNOWN_PROMPT.point:g} tokens ({UNKNOWN_PROMPT.low:g} to {UNKNOWN_PROMPT.high:g})"
        )
    if known := text_tokens(model):
        per_byte, template = known
        exact = Span(text.low * per_byte, text.point * per_byte, text.high * per_byte)
        return exact + Span.exactly(template), (
            f"prompt length: not measured yet: the questions' {text.point:.0f} bytes, "
            f"{per_byte:g} token a byte in {model}'s tokenizer, plus {template} for its chat "
            "template"
        )
    prompt = Span(
        max(text.low / BYTES_PER_TOKEN, 1) + TEMPLATE_TOKENS.low,
        text.point / BYTES_PER_TOKEN + TEMPLATE_TOKENS.point,
        text.high + TEMPLATE_TOKENS.high,
    )
    return prompt, (
        f"prompt length: not measured yet: from the questions' {text.point:.0f} bytes, about "
        f"{BYTES_PER_TOKEN} a token plus {TEMPLATE_TOKENS.point:g} for the chat template "
        f"(at most a token a byte plus {TEMPLATE_TOKENS.high:g})"
    )


def another_tokenizer(spec: JobSpec) -> str | None:
    """A teacher whose tokenizer is visibly not the student's (presets of another), by
    name, or None: it reads the prompt and the completions in tokens of its own."""
    student = preset_tokenizer(spec.student.base_model)
    for teacher in spec.teacher_specs().values():
        model = teacher.server.tokenizer if teacher.server is not None else teacher.base_model
        theirs = preset_tokenizer(model or spec.student.base_model)
        if student is not None and theirs is not None and theirs != student:
            return model
    return None


def per_student_token(spec: JobSpec) -> Span:
    """Another tokenizer's tokens for one student token of the same text: a byte-level
    student's token is a byte, of which another's tokens hold 1 to 8 (about 4)."""
    byte_level = text_tokens(spec.student.base_model) is not None
    return CROSS_RATE_BYTES if byte_level else CROSS_RATE


def spread(measured_length: float) -> Span:
    """A length earlier jobs measured, its bounds PROMPT_SPREAD either side."""
    return Span(
        measured_length * (1 - PROMPT_SPREAD),
        measured_length,
        measured_length * (1 + PROMPT_SPREAD),
    )


def mean(values: list[float], weights: list[int]) -> float:
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


def lengths_of(
    spec: JobSpec, seen: list[Measured], files: FileQuestions
) -> tuple[Lengths, list[str]]:
    """Each length's span, and the basis of each in words."""
    most, most_eval = spec.sampling.max_tokens, max_eval_tokens(spec)
    stops = f"completions of 1 to max_tokens {most} tokens"
    if not seen:
        prompt, prompt_basis = cold_prompt(spec, spec.student.base_model, files)
        teacher_prompt, ratio = prompt, Span.exactly(1)
        teachers_basis = "teacher prompts: as long as the student's"
        if other := another_tokenizer(spec):
            teacher_prompt, ratio = cold_prompt(spec, other, files)[0], per_student_token(spec)
            teachers_basis = (
                f"teacher {other} reads the text in tokens of its own: its prompt about "
                f"{teacher_prompt.point:.0f} tokens, {ratio.point:g} of its tokens a student "
                f"token ({ratio.low:g} to {ratio.high:g})"
            )
        lengths = Lengths(
            completion=Span(1, most, most),
            prompt=prompt,
            teacher_prompt=teacher_prompt,
            eval_completion=Span(1, most_eval, most_eval),
            baseline_completion=Span(1, most_eval, most_eval),
            teacher_per_token=ratio,
        )
        return lengths, [
            f"{stops}; no earlier job of this team succeeded with this student, teachers and "
            "dataset: the point assumes every completion runs to max_tokens",
            prompt_basis,
            teachers_basis,
        ]
    weights = [m.completions for m in seen]
    completion = min(max(mean([m.completion for m in seen], weights), 1), most)
    prompt = mean([m.prompt for m in seen], weights)
    teacher_prompt = mean([m.teacher_prompt for m in seen], weights)
    evals = [m.eval_completion for m in seen if m.eval_completion is not None]
    eval_completion = min(max(sum(evals) / len(evals), 1), most_eval) if evals else most_eval
    jobs = ", ".join(str(m.job_id) for m in seen)
    lengths = Lengths(
        completion=Span(1, completion, most),
        prompt=spread(prompt),
        teacher_prompt=spread(teacher_prompt),
        eval_completion=Span(1, eval_completion, most_eval),
        baseline_completion=Span(1, eval_completion, most_eval),
    )
    return lengths, [
        f"{stops}; the point uses the mean length of earlier jobs {jobs} (same student, "
        f"teachers and dataset): {completion:.1f} tokens a completion"
        + (f", {eval_completion:.1f} an eval completion" if evals else ""),
        f"prompt length: as those jobs rendered them, {prompt:.1f} tokens (the teacher's "
        f"{teacher_prompt:.1f}), the bounds {PROMPT_SPREAD:.0%} either side",
    ]


def counts_basis(spec: JobSpec, shape: Shape) -> list[str]:
    loop = spec.loop
    lines = [
        f"{shape.steps} steps x {loop.batch_size} prompts x {loop.group_size} completions = "
        f"{shape.steps * shape.completions_per_step} completions, each scored by "
        f"{shape.readers} teacher{'s' if shape.readers > 1 else ''} and trained on",
    ]
    if spec.eval is not None:
        prompts, fixed = eval_prompts(spec)
        size = "" if fixed else f" (the eval dataset's size is not in the spec: assumed {prompts})"
        lines.append(
            f"{shape.evals} evals x {prompts} prompts x {spec.eval.samples_per_prompt} samples"
            + (", and the teacher baseline once" if shape.baseline else "")
            + size
        )
    return lines


def priced(prices: PriceTable, spec: JobSpec, figures: Tokens) -> CostSpan | None:
    """The cost of each bound from the price table; None where a price is missing."""
    models = models_of(spec.model_dump(mode="json"))
    costs = [
        prices.cost(
            *models,
            sampled=round(getattr(figures.sampled, bound)),
            teacher_tokens=round(getattr(figures.teacher, bound)),
            trained=round(getattr(figures.trained, bound)),
            eval_tokens=round(getattr(figures.eval, bound)),
        )
        for bound in ("low", "point", "high")
    ]
    if any(cost is None for cost in costs):
        return None
    low, point, high = costs
    assert low is not None and point is not None and high is not None
    return CostSpan(low=low, point=point, high=high)


def span_public(span: Span) -> TokenSpan:
    return TokenSpan(low=int(span.low), point=int(span.point), high=int(span.high))


def estimate_of(
    spec: JobSpec, seen: list[Measured], prices: PriceTable, files: FileQuestions
) -> tuple[Tokens, Estimate]:
    """The estimate of an admitted spec, given what was measured before and the reports
    of the files it reads (no budget yet)."""
    shape = shape_of(spec)
    lengths, basis = lengths_of(spec, seen, files)
    figures = tokens(shape, lengths)
    cost = priced(prices, spec, figures)
    models = models_of(spec.model_dump(mode="json"))
    cost_basis = (
        "cost: the price table's prices for "
        f"{models.backend} {models.student} (student) and {models.teacher} (teacher)"
        if cost is not None
        else "cost: unknown: "
        + ("the service has no price table" if not prices else "a price it needs is missing")
    )
    total = figures.sampled + figures.teacher + figures.trained + figures.eval
    estimate = Estimate(
        sampled_tokens=span_public(figures.sampled),
        teacher_tokens=span_public(figures.teacher),
        trained_tokens=span_public(figures.trained),
        eval_tokens=span_public(figures.eval),
        total_tokens=span_public(total),
        cost=cost,
        basis=[*counts_basis(spec, shape), *basis, cost_basis],
        history=[m.job_id for m in seen],
        budget=None,
    )
    return figures, estimate


async def estimate_spec(
    session: AsyncSession,
    team_id: int,
    spec: JobSpec,
    settings: Settings,
    prices: PriceTable,
    now: datetime,
) -> Estimate:
    """Admit `spec` as a job of the team would be (SpecRefused as for a job), then
    estimate it against what the team has left; nothing is stored."""
    spec = await admit(session, team_id, spec, settings)
    seen, files = await history(session, team_id, spec), await file_reports(session, team_id, spec)
    _, estimate = estimate_of(spec, seen, prices, files)
    await with_budget(session, team_id, estimate, prices, now)
    return estimate


async def with_budget(
    session: AsyncSession, team_id: int, estimate: Estimate, prices: PriceTable, now: datetime
) -> None:
    """Say how the estimate compares with what is left of the team's budget."""
    found = await standing(session, team_id, prices, now)
    await session.rollback()
    if found is None:
        return
    remaining = left(found.limit, found.spend)
    if found.limit.tokens is not None:
        point, high = estimate.total_tokens.point, estimate.total_tokens.high
    else:
        cost = estimate.cost
        point, high = (cost.point, cost.high) if cost else (float("inf"), float("inf"))
    estimate.budget = BudgetFit(
        unit="tokens" if found.limit.tokens is not None else "cost",
        left=remaining,
        point_exceeds=point > remaining,
        high_exceeds=high > remaining,
    )


async def estimate_of_job(session: AsyncSession, job: Job, prices: PriceTable) -> Estimate | None:
    """What a job's estimate was when it was submitted (from the jobs before it), to show
    beside what it used; None for a spec this service no longer parses."""
    try:
        spec = stored_spec(job.spec)
    except ValueError:
        return None
    assert job.id is not None
    seen = await history(session, job.team_id, spec, before=job.id)
    return estimate_of(spec, seen, prices, await file_reports(session, job.team_id, spec))[1]


async def file_reports(session: AsyncSession, team_id: int, spec: JobSpec) -> dict[str, FileReport]:
    """The reports of the team's uploaded files the spec reads (a file deleted since: none)."""
    reports = {}
    for share in spec.dataset_shares():
        if isinstance(share, FileDataset) and share.file and share.file not in reports:
            try:
                row = await get_file(session, row_id(share.file), team_id)
            except FileNotFound:
                continue
            reports[share.file] = FileReport.model_validate(row.report)
    return reports


def used_by(job: Job, prices: PriceTable) -> dict[str, Any]:
    """What a job used, by the estimate's figures (and its cost, None without a price)."""
    used = job.usage.model_dump(exclude={"estimated_cost"})
    cost = prices.cost(
        *models_of(job.spec),
        sampled=job.sampled_tokens,
        teacher_tokens=job.teacher_tokens,
        trained=job.trained_tokens,
        eval_tokens=job.eval_tokens,
    )
    return used | {"total_tokens": sum(used.values()), "cost": cost}
