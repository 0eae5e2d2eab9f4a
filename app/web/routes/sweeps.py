"""Sweeps on the dashboard: the list, a sweep's page (its trials, a scatter per parameter,
the best trials' curves, the best trial's spec), a new sweep from a job, and cancel."""

from __future__ import annotations

from typing import Annotated

import yaml
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import ValidationError

from app.api.deps import MAX_ID, SessionDep, SettingsDep, SweepId
from app.audit.store import record_audit
from app.auth.schemas import Scope
from app.core.documents import TooLargeToStore
from app.jobs.errors import JobNotFound, SpecRefused
from app.jobs.rows import get_job
from app.jobs.service import DASHBOARD
from app.sweeps.proposal import starting_definition
from app.sweeps.schemas import SweepCreate, SweepDetail, SweepStatus, TrialPublic
from app.sweeps.service import cancel_sweep, list_sweeps, read_sweep, submit_definition
from app.web.charts import MAX_POINTS
from app.web.deps import CSRF_CHECKED, ActingViewerDep, FormDep, ViewerDep
from app.web.spec_form import YamlRefused, read_yaml
from app.web.templating import render
from kernel.spec import format_validation_error
from kernel.team_view import masked_spec

router = APIRouter(prefix="/ui", include_in_schema=False)

LISTED = 100
BEST_CURVES = 3


@router.get("/sweeps")
async def sweeps_page(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    """The team's sweeps (every team's for an admin), newest first."""
    sweeps, _ = await list_sweeps(session, viewer.scope, None, LISTED)
    return render(request, "sweeps.html", {"viewer": viewer, "sweeps": sweeps})


def ranked(detail: SweepDetail) -> list[TrialPublic]:
    """Trials with a metric, best first: succeeded ones, then the rest."""
    maximize = detail.metric.goal == "maximize"
    scored = [t for t in detail.trials if t.metric is not None]
    scored.sort(key=lambda t: (t.status != "succeeded", -t.metric if maximize else t.metric))  # type: ignore[operator]
    return scored


def form_page(request: Request, viewer: object, text: str, error: str | None) -> Response:
    context = {"viewer": viewer, "text": text, "error": error}
    return render(request, "new_sweep.html", context, 422 if error else 200)


@router.get("/sweeps/new")
async def new_sweep_page(
    request: Request,
    session: SessionDep,
    viewer: ViewerDep,
    base_job: Annotated[int, Query(ge=1, le=MAX_ID)],
) -> Response:
    """The form, prefilled with a sweep around job `base_job`."""
    job = await get_job(session, base_job, viewer.scope)
    proposal = yaml.safe_dump(starting_definition(base_job, job.spec), sort_keys=False)
    return form_page(request, viewer, proposal, None)


@router.post("/sweeps/new")
async def submit_sweep(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    viewer: ActingViewerDep,
    form: FormDep,
) -> Response:
    """Create the sweep as POST /v1/sweeps does and go to its page; on an error show the
    form again with the message. Needs the `submit` scope; audited."""
    text = form.get("definition", "")
    try:
        body = SweepCreate.model_validate(read_yaml(text, "a sweep"))
        sweep, _ = await submit_definition(session, viewer, body, settings, DASHBOARD)
    except YamlRefused as refused:
        where = "" if refused.line is None else f" (line {refused.line})"
        return form_page(request, viewer, text, f"{refused}{where}")
    except ValidationError as error:
        return form_page(request, viewer, text, format_validation_error(error, SweepCreate))
    except SpecRefused as error:
        return form_page(request, viewer, text, str(error))
    except JobNotFound as error:
        return form_page(request, viewer, text, f"base_job: {error}")
    except TooLargeToStore as error:
        return form_page(request, viewer, text, str(error))
    return RedirectResponse(f"/ui/sweeps/{sweep.id}", status_code=303)


@router.get("/sweeps/{sweep_id}")
async def sweep_page(
    request: Request, sweep_id: SweepId, session: SessionDep, viewer: ViewerDep
) -> Response:
    detail = await read_sweep(session, sweep_id, viewer.scope)
    best_spec = None
    if detail.best is not None:
        best_job = await get_job(session, detail.best.job_id)
        shown = best_job.spec if viewer.is_admin else masked_spec(best_job.spec)
        best_spec = yaml.safe_dump(shown, sort_keys=False, allow_unicode=True)
    config = {
        "metric": detail.metric.name,
        "goal": detail.metric.goal,
        "parameters": {
            path: {"log": p.distribution == "log_uniform", "values": p.values}
            for path, p in detail.parameters.items()
        },
        "trials": [t.model_dump(mode="json") for t in detail.trials],
        "best_jobs": [t.job_id for t in ranked(detail)[:BEST_CURVES]],
        "max_points": MAX_POINTS,
    }
    context = {
        "viewer": viewer,
        "sweep": detail,
        "paths": list(detail.parameters),
        "best_spec": best_spec,
        "config": config,
        "can_cancel": viewer.allows(Scope.submit) and detail.status == SweepStatus.running,
    }
    return render(request, "sweep.html", context)


@router.post("/sweeps/{sweep_id}/cancel", dependencies=CSRF_CHECKED)
async def cancel(sweep_id: SweepId, session: SessionDep, viewer: ActingViewerDep) -> Response:
    await cancel_sweep(session, sweep_id, viewer.scope)
    detail = {"via": "dashboard"}
    await record_audit(session, viewer, "sweep.cancel", f"sweep {sweep_id}", 303, detail)
    return RedirectResponse(f"/ui/sweeps/{sweep_id}", status_code=303)
