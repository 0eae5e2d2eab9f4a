"""Sweeps: create a search over a job spec, list them, read one with its trials, cancel.
The trials themselves are started and stopped by the controller in the workers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.api.deps import Cursor, PrincipalDep, SessionDep, SettingsDep
from app.api.errors import ApiError, error_responses
from app.api.routes.jobs import check_submittable
from app.continuation import SpecRefused, continued
from app.models import SweepCreate, SweepDetail, SweepMethod, SweepsPage
from app.store.audit import record_audit
from app.store.rows import get_job
from app.store.sweeps import cancel_sweep, create_sweep, list_sweeps, read_sweep
from app.sweep_search import InvalidTrial, extremes, grid, grid_size, trial_spec
from kernel.spec import SpecError, parse_spec

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], responses=error_responses(401, 422, 503))

MAX_PAGE = 100
SweepId = Annotated[int, Path(ge=1, le=2**31 - 1, description="The sweep's id.")]


async def resolved(body: SweepCreate, session: SessionDep, principal: PrincipalDep) -> SweepCreate:
    """The definition with `base` the validated spec every trial starts from: the one
    given (its init_from resolved as a job's is), or `base_job`'s (a job of the team)."""
    if body.base_job is not None:
        job = await get_job(session, body.base_job, principal.scope)
        return body.model_copy(update={"base": job.spec})
    try:
        spec = parse_spec(body.base)
        spec = await continued(session, principal.scope, spec)
    except SpecError as error:
        param = f"base.{error.problems[0][0]}" if error.problems else "base"
        raise ApiError(422, "invalid_request", f"base: {error}", param) from None
    except SpecRefused as error:
        raise ApiError(422, "invalid_request", f"base.{error}", f"base.{error.param}") from None
    return body.model_copy(update={"base": spec.model_dump(mode="json")})


async def check_trials(
    body: SweepCreate, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> None:
    """A 422 before anything is stored: a grid larger than max_trials, or a parameter
    value that makes an invalid spec or one the team may not submit (`check_submittable`),
    for every grid point, else each value and range end."""
    if body.method is SweepMethod.grid and grid_size(body) > body.max_trials:
        raise ApiError(
            422,
            "invalid_request",
            f"max_trials: the grid has {grid_size(body)} points, more than max_trials "
            f"({body.max_trials}); raise max_trials or give fewer values",
            "max_trials",
        )
    assert body.base is not None
    probes = grid(body) if body.method is SweepMethod.grid else extremes(body)
    for values in probes:
        try:
            spec = trial_spec(body.base, values, body.name)
        except InvalidTrial as error:
            raise ApiError(422, "invalid_request", str(error), error.param) from None
        await check_submittable(session, principal.team_id, spec, settings)


@router.post(
    "", status_code=201, response_model=SweepDetail, responses=error_responses(400, 403, 404, 413)
)
async def submit_sweep(
    body: SweepCreate, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> SweepDetail:
    """Store the sweep; the workers' controller starts its trials (ordinary jobs of the
    team, within its limits and `parallel`) and stops the losers. `base_job` must be one
    of the team's jobs."""
    definition = await resolved(body, session, principal)
    await check_trials(definition, session, principal, settings)
    sweep = await create_sweep(
        session, principal.team_id, definition, settings.max_spec_bytes, commit=False
    )
    await record_audit(session, principal, "sweep.create", f"sweep {sweep.id}", 201)
    return await read_sweep(session, sweep.id or 0)


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
