"""The jobs table, a job's page, and the actions on a job (pause, resume, cancel)."""

from __future__ import annotations

from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from app.api.deps import JobId, PricesDep, QueueDep, SessionDep, SettingsDep, SnapshotsDep
from app.audit.store import record_audit
from app.auth.keys import Principal
from app.auth.schemas import Scope
from app.budgets.errors import BudgetExceeded
from app.budgets.estimates import estimate_of_job, used_by
from app.budgets.service import refuse_if_exhausted
from app.core.config import Settings
from app.core.tables import utcnow
from app.jobs.dispatch import enqueue_job
from app.jobs.errors import IllegalTransition
from app.jobs.rows import get_job
from app.jobs.schemas import EventPublic, JobAction, JobStatus
from app.jobs.service import queue_places, queue_reason
from app.jobs.store import apply_action
from app.jobs.tables import Event, Job
from app.jobs.transitions import plan_action
from app.jobs.visibility import team_event
from app.web import charts, present, reads
from app.web.deps import CSRF_CHECKED, ActingViewerDep, ViewerDep
from app.web.errors import WebError
from app.web.routes.usage import budget_banner
from app.web.templating import render
from kernel.team_view import masked_spec, masked_text

router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE_SIZE = 25
MAX_PAGE = 100_000
MAX_ROWS = 100
RECENT_STEPS = 20
EVENTS_SHOWN = 200
CHECKPOINTS_SHOWN = 100
ROLLOUTS_SHOWN = 4


def parse_status(status: str) -> JobStatus | None:
    if not status:
        return None
    try:
        return JobStatus(status)
    except ValueError as error:
        raise WebError(400, f"Unknown status {status!r}.") from error


async def table_rows(
    session: SessionDep, jobs: list[Job], settings: Settings
) -> list[dict[str, Any]]:
    """What each row of the jobs table shows (a queued job: its place, and why it waits)."""
    now = utcnow()
    waiting = [(job.id, job.team_id) for job in jobs if job.status == JobStatus.queued]
    places = await queue_places(session, waiting, settings)
    return [
        {
            "job": job,
            "place": places.get(job.id),
            "waiting": queue_reason(job.queue_reason, places.get(job.id))
            if job.id in places
            else None,
            "reverse_kl": present.last_value(job.summary.reverse_kl),
            "eval_accuracy": present.last_value(job.summary.eval_accuracy),
            "progress": present.progress(job.steps_done, job.total_steps, job.status),
            "elapsed": present.elapsed(job.started_at, job.finished_at, now),
            "live": job.status in present.LIVE_STATUSES,
        }
        for job in jobs
    ]


@router.get("/jobs")
async def jobs_page(
    request: Request,
    session: SessionDep,
    viewer: ViewerDep,
    prices: PricesDep,
    settings: SettingsDep,
    status: Annotated[str, Query(max_length=20)] = "",
    q: Annotated[str, Query(max_length=200)] = "",
    page: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1,
) -> Response:
    """The team's jobs (every team's for an admin), newest first, filtered and searched."""
    banner = await budget_banner(session, viewer, prices)
    chosen = parse_status(status)
    jobs, total = await reads.list_jobs(
        session, viewer.scope, chosen, q.strip(), (page - 1) * PAGE_SIZE, PAGE_SIZE
    )
    pages = max(1, -(-total // PAGE_SIZE))
    context = {
        "viewer": viewer,
        "rows": await table_rows(session, jobs, settings),
        "statuses": list(JobStatus),
        "status": status,
        "q": q,
        "page": page,
        "pages": pages,
        "total": total,
        "budget_banner": banner,
    }
    return render(request, "jobs.html", context)


@router.get("/jobs/rows")
async def job_rows(
    request: Request,
    session: SessionDep,
    viewer: ViewerDep,
    settings: SettingsDep,
    ids: Annotated[str, Query(max_length=2000, pattern=r"^\d{1,10}(,\d{1,10})*$")],
) -> Response:
    """Fresh rows for the jobs table's live rows (the page asks every few seconds)."""
    wanted = sorted({int(part) for part in ids.split(",")})[:MAX_ROWS]
    jobs = await reads.jobs_by_id(session, viewer.scope, wanted)
    return render(request, "rows.html", {"rows": await table_rows(session, jobs, settings)})


def allowed_actions(status: str) -> list[JobAction]:
    """The actions that would change the job now (the store's own rules decide)."""
    allowed = []
    for action in JobAction:
        try:
            if plan_action(action, JobStatus(status)) is not None:
                allowed.append(action)
        except IllegalTransition:
            continue
    return allowed


def seen_events(viewer: Principal, events: list[Event]) -> list[Event] | list[EventPublic]:
    """Events as the viewer's key sees them: a team's, with no worker folder in them."""
    if viewer.is_admin:
        return events
    return [team_event(EventPublic.model_validate(event)) for event in events]


def seen_text(viewer: Principal, text: str | None) -> str | None:
    return text if viewer.is_admin or text is None else masked_text(text)


@router.get("/jobs/{job_id}")
async def job_page(
    request: Request,
    job_id: JobId,
    session: SessionDep,
    viewer: ViewerDep,
    prices: PricesDep,
    settings: SettingsDep,
) -> Response:
    """Status, progress and ETA, why it waits (queued or paused), live charts, events,
    checkpoints, its estimate beside what it used, spec and actions."""
    job = await get_job(session, job_id, viewer.scope)
    rows = await table_rows(session, [job], settings)
    recent = await reads.recent_steps(session, job.id, RECENT_STEPS)
    names = await reads.first_metric_names(session, job.id)
    latest = recent[-1][2] if recent else {}
    shown = charts.job_charts(list(dict.fromkeys([*names, *latest])))
    now = utcnow()
    context = {
        "viewer": viewer,
        "job": job,
        "waiting": rows[0]["waiting"] or present.paused_reason(job.status, job.stop_reason),
        "progress": present.progress(job.steps_done, job.total_steps, job.status),
        "now": present.now_doing(job.status, job.progress),
        "elapsed": present.elapsed(job.started_at, job.finished_at, now),
        "summary": job.summary,
        "reverse_kl": present.last_value(job.summary.reverse_kl),
        "charts": shown,
        "chart_config": {
            "job_id": job.id,
            "charts": [chart.as_json() for chart in shown],
            "keys": charts.chart_keys(shown),
            "max_points": charts.MAX_POINTS,
            "next_step": recent[-1][0] + 1 if recent else 0,
            "total_steps": job.total_steps,
            "finished": present.is_finished(job.status),
            "status": job.status,
        },
        "finished": present.is_finished(job.status),
        "events": seen_events(viewer, await reads.job_events(session, job.id, EVENTS_SHOWN)),
        "notes": seen_events(viewer, await reads.job_notes(session, job.id)),
        "error_message": seen_text(viewer, job.error_message),
        "checkpoints": await reads.job_checkpoints(session, job.id, CHECKPOINTS_SHOWN),
        "spec_yaml": yaml.safe_dump(
            job.spec if viewer.is_admin else masked_spec(job.spec),
            sort_keys=False,
            allow_unicode=True,
        ),
        "rollouts": [
            present.rollout(sample.step, sample.prompt, sample.tokens, sample.reverse_kl)
            for sample in await reads.kept_rollouts(session, job.id, ROLLOUTS_SHOWN)
        ],
        "actions": allowed_actions(job.status) if viewer.allows(Scope.submit) else [],
        "estimate": await estimate_of_job(session, job, prices),
        "used": used_by(job, prices),
    }
    return render(request, "job.html", context)


@router.post("/jobs/{job_id}/{action}", dependencies=CSRF_CHECKED)
async def act_on_job(
    job_id: JobId,
    action: JobAction,
    session: SessionDep,
    queue: QueueDep,
    snapshots: SnapshotsDep,
    viewer: ActingViewerDep,
    prices: PricesDep,
) -> Response:
    """Cancel, pause or resume, exactly as the API does (a resumed job is queued again;
    not while its team's budget is spent); needs a key with the `submit` scope, and is
    audited."""
    job = await get_job(session, job_id, viewer.scope)
    if action is JobAction.resume and job.status == JobStatus.paused:
        try:
            await refuse_if_exhausted(session, job.team_id, prices, utcnow())
        except BudgetExceeded as spent:
            raise WebError(429, f"Job #{job_id} stays paused: {spent}.") from None
    result = await apply_action(session, job_id, action, viewer.scope, commit=False)
    detail = {"status": result.job.status, "changed": result.changed, "via": "dashboard"}
    await record_audit(session, viewer, f"job.{action}", f"job {job_id}", 303, detail)
    if result.changed and result.job.status == JobStatus.queued and action is JobAction.resume:
        await enqueue_job(session, queue, job_id)
    snapshots.drop(job_id)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)
