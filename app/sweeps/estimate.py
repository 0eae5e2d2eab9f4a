"""A sweep's estimate (`POST /v1/sweeps/estimate`): admitted like a sweep, nothing stored;
every trial it plans estimated as a job (app/budgets/estimates.py), their sum, and what
early stopping may save of it.

A grid's trials are its points. Random search draws the values its controller will draw
(the same seed); TPE's first trials are those random draws too, and its later ones depend on
results nobody has yet: they are estimated as random draws, and the basis says so.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.keys import Principal
from app.budgets.counts import Span, early_stopping_saving, share_run
from app.budgets.estimates import (
    Measured,
    alike,
    estimate_of,
    file_reports,
    history,
    with_budget,
)
from app.budgets.schemas import CostSpan, Estimate, SweepEstimate, TokenSpan, TrialEstimate
from app.core.config import Settings
from app.core.pricing import PriceTable
from app.sweeps.admission import admit_sweep
from app.sweeps.early_stopping import rungs
from app.sweeps.schemas import SweepCreate, SweepMethod
from app.sweeps.search import grid, planned_trials, random_values, trial_spec
from kernel.spec import JobSpec


def trial_values(sweep: SweepCreate) -> list[dict[str, object]]:
    """The values of every trial the sweep plans, as far as they can be known now."""
    if sweep.method is SweepMethod.grid:
        return grid(sweep)
    return [random_values(sweep, number) for number in range(1, planned_trials(sweep) + 1)]


def added(spans: list[TokenSpan]) -> TokenSpan:
    return TokenSpan(
        low=sum(s.low for s in spans),
        point=sum(s.point for s in spans),
        high=sum(s.high for s in spans),
    )


def summed(estimates: list[Estimate], basis: list[str]) -> Estimate:
    """The trials' estimates added up (the cost unknown if any trial's is)."""
    costs = [e.cost for e in estimates]
    cost = None
    if all(c is not None for c in costs):
        cost = CostSpan(
            low=sum(c.low for c in costs if c),
            point=sum(c.point for c in costs if c),
            high=sum(c.high for c in costs if c),
        )
    return Estimate(
        **{
            figure: added([getattr(e, figure) for e in estimates])
            for figure in (
                "sampled_tokens", "teacher_tokens", "trained_tokens", "eval_tokens", "total_tokens",
            )
        },
        cost=cost,
        basis=basis,
        history=sorted({job for e in estimates for job in e.history}),
        budget=None,
    )  # fmt: skip


def saving(sweep: SweepCreate, trials: list[tuple[JobSpec, Estimate]]) -> TokenSpan | None:
    """What early stopping may save of the trials' tokens (None without early stopping):
    ASHA keeps 1/eta of the trials at each rung, the median rule about half."""
    rule = sweep.early_stop
    if rule is None:
        return None
    keep = 1 / rule.eta if rule.type == "asha" else 0.5
    shares = []
    for spec, estimate in trials:
        tokens = estimate.total_tokens
        steps = spec.loop.steps
        shares.append(
            (
                Span(tokens.low, tokens.point, tokens.high),
                share_run(rungs(rule, steps), steps, keep),
            )
        )
    saved = early_stopping_saving(shares)
    return TokenSpan(low=int(saved.low), point=int(saved.point), high=int(saved.high))


async def estimate_sweep(
    session: AsyncSession,
    principal: Principal,
    body: SweepCreate,
    settings: Settings,
    prices: PriceTable,
    now: datetime,
) -> SweepEstimate:
    """Admit the sweep as `POST /v1/sweeps` would (the same refusals) and estimate every
    trial it plans; nothing is stored."""
    definition = await admit_sweep(session, principal, body, settings)
    assert definition.base is not None
    seen: dict[str, list[Measured]] = {}
    trials: list[tuple[JobSpec, Estimate]] = []
    public = []
    for number, values in enumerate(trial_values(definition), start=1):
        spec = trial_spec(definition.base, values, f"{definition.name}-{number}")
        key = alike(spec)
        if key not in seen:
            seen[key] = await history(session, principal.team_id, spec)
        files = await file_reports(session, principal.team_id, spec)
        _, estimate = estimate_of(spec, seen[key], prices, files)
        trials.append((spec, estimate))
        public.append(TrialEstimate(number=number, values=dict(values), estimate=estimate))
    basis = [f"{len(trials)} trials, each estimated as a job (see each trial's basis)"]
    if definition.method is SweepMethod.tpe:
        basis.append(
            "TPE's values after its first trials depend on their results: every trial is "
            "estimated at the values random search would draw"
        )
    total = summed([estimate for _, estimate in trials], basis)
    await with_budget(session, principal.team_id, total, prices, now)
    return SweepEstimate(
        trials=public, total=total, early_stopping_saves=saving(definition, trials)
    )
