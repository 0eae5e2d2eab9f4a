"""Sweeps: create a search over a job spec, list them, read one with its trials, cancel.
The trials themselves are started and stopped by the controller in the workers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api.deps import Cursor, PricesDep, PrincipalDep, SessionDep, SettingsDep, SweepId
from app.api.errors import error_responses
from app.api.routes.jobs import IdempotencyKey
from app.audit.store import record_audit
from app.budgets.schemas import SweepEstimate
from app.budgets.service import refuse_if_exhausted
from app.core.idempotency import Idempotency
from app.core.tables import utcnow
from app.jobs.service import API
from app.sweeps.estimate import estimate_sweep
from app.sweeps.schemas import SweepCreate, SweepDetail, SweepsPage
from app.sweeps.service import cancel_sweep, list_sweeps, read_sweep, submit_definition
from app.sweeps.store import sweep_keyed

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], responses=error_responses(401, 422, 503))

MAX_PAGE = 100


@router.post(
    "",
    status_code=201,
    response_model=SweepDetail,
    responses={
        200: {"model": SweepDetail, "description": "Idempotent repeat: the sweep first created."},
        **error_responses(400, 403, 404, 413, 415),
    },
)
async def submit_sweep(
    body: SweepCreate,
    request: Request,
    response: Response,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    prices: PricesDep,
    idempotency_key: IdempotencyKey = None,
) -> SweepDetail:
    """Store the sweep; the workers' controller starts its trials (ordinary jobs of the
    team, within its limits and `parallel`) and stops the losers. Nothing is stored unless
    the base and every grid point (else every listed value and range end) make a spec the
    team may submit (app/jobs/admission.py; a 422 names the parameter). `base_job` must be one
    of the team's jobs. With the team's budget spent this period: 429 `budget_exceeded`. With
    an `Idempotency-Key`, a retry of the request is the sweep first made (200; so even once
    the budget is spent); the key with another body is a 422."""
    idempotency = None
    if idempotency_key is not None:
        idempotency = Idempotency(idempotency_key, "POST /v1/sweeps", await request.json())
    if idempotency is None or not await sweep_keyed(session, principal.team_id, idempotency):
        await refuse_if_exhausted(session, principal.team_id, prices, utcnow())
    sweep, made = await submit_definition(session, principal, body, settings, API, idempotency)
    if not made:
        response.status_code = 200
    return await read_sweep(session, sweep.id or 0)


@router.post(
    "/estimate", response_model=SweepEstimate, responses=error_responses(400, 403, 404, 413, 415)
)
async def estimate_sweep_route(
    body: SweepCreate,
    session: SessionDep,
    principal: PrincipalDep,
    settings: SettingsDep,
    prices: PricesDep,
) -> SweepEstimate:
    """What the sweep would use, without creating it: admitted as `POST /v1/sweeps` admits
    it (the same 422s), nothing stored. Every trial it plans is estimated as
    `POST /v1/jobs/estimate` estimates a job (a grid's points; random search's draws, the
    controller's own; TPE's estimated as random draws), `total` adds them up, and
    `early_stopping_saves` says what early stopping may save of it (none at worst)."""
    return await estimate_sweep(session, principal, body, settings, prices, utcnow())


@router.get("", response_model=SweepsPage)
async def get_sweeps(
    session: SessionDep,
    principal: PrincipalDep,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
) -> SweepsPage:
    """The caller's sweeps (every team's for an admin key), newest first."""
    data, cursor = await list_sweeps(session, principal.scope, after, limit)
    return SweepsPage(data=data, next_cursor=cursor)


@router.get("/{sweep_id}", response_model=SweepDetail, responses=error_responses(404))
async def get_sweep_detail(
    sweep_id: SweepId, session: SessionDep, principal: PrincipalDep
) -> SweepDetail:
    """The sweep and its trials: values, status, metric, the best so far."""
    return await read_sweep(session, sweep_id, principal.scope)


@router.post("/{sweep_id}/cancel", response_model=SweepDetail, responses=error_responses(404))
async def cancel(sweep_id: SweepId, session: SessionDep, principal: PrincipalDep) -> SweepDetail:
    """End the sweep and cancel its unfinished trials (running ones stop at a step
    boundary). Cancelling an ended sweep cancels nothing more."""
    detail = await cancel_sweep(session, sweep_id, principal.scope)
    await record_audit(session, principal, "sweep.cancel", f"sweep {sweep_id}", 200)
    return detail
