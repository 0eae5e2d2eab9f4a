"""A new job from a YAML spec: prefilled from the tiny example or cloned from a job,
submitted as the API submits one (app/jobs/service.py) with each error at its field, once
per form."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated

import yaml
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from app.api.deps import MAX_ID, PricesDep, QueueDep, SessionDep, SettingsDep
from app.budgets.errors import BudgetExceeded, BudgetRefused
from app.budgets.estimates import estimate_spec
from app.budgets.schemas import Estimate
from app.budgets.service import admit_spending
from app.core.documents import TooLargeToStore
from app.core.pricing import PriceTable
from app.core.tables import utcnow
from app.jobs.continuation import editable
from app.jobs.errors import SpecRefused
from app.jobs.limits import QueueFull
from app.jobs.rows import get_job
from app.jobs.service import DASHBOARD, submit_spec
from app.jobs.store import Idempotency
from app.web.deps import ActingViewerDep, FormDep, ViewerDep
from app.web.errors import WebError
from app.web.spec_form import FieldError, check_spec_text
from app.web.templating import render
from kernel.spec.documents import line_of

router = APIRouter(prefix="/ui", include_in_schema=False)

DEMO_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "arith.yaml"
"""What the form starts from: the demo's job, whose objective learns most (a job a new
user submits as it is shows the student getting better)."""
MAX_KEY_CHARS = 255


def example_spec() -> str:
    return DEMO_EXAMPLE.read_text() if DEMO_EXAMPLE.is_file() else "name: my-job\n"


def errors_by_line(errors: list[FieldError]) -> dict[int, list[FieldError]]:
    placed: dict[int, list[FieldError]] = {}
    for error in errors:
        if error.line is not None:
            placed.setdefault(error.line, []).append(error)
    return placed


def at_field(text: str, param: str, message: str) -> list[FieldError]:
    """A refusal shown at the line of the field it names."""
    return [FieldError(param, line_of(yaml.compose(text), param), message)]


def form_page(
    request: Request,
    viewer: object,
    text: str,
    idempotency_key: str,
    errors: list[FieldError],
    status_code: int = 200,
    estimate: Estimate | None = None,
) -> Response:
    context = {
        "viewer": viewer,
        "estimate": estimate,
        "text": text,
        "lines": text.splitlines(),
        "idempotency_key": idempotency_key,
        "errors": errors,
        "errors_at": errors_by_line(errors),
    }
    return render(request, "new_job.html", context, status_code)


@router.get("/new")
async def new_job_page(
    request: Request,
    session: SessionDep,
    viewer: ViewerDep,
    clone: Annotated[int | None, Query(alias="from", ge=1, le=MAX_ID)] = None,
) -> Response:
    """The form, prefilled with the tiny example or with the spec of job `from`; "Estimate"
    shows what the job would use before "Create job" submits it."""
    if clone is None:
        text = example_spec()
    else:
        job = await get_job(session, clone, viewer.scope)
        text = yaml.safe_dump(editable(job.spec), sort_keys=False, allow_unicode=True)
    return form_page(request, viewer, text, str(uuid.uuid4()), [])


@router.post("/new/estimate")
async def estimate_job(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    prices: PricesDep,
    viewer: ActingViewerDep,
    form: FormDep,
) -> Response:
    """The form again, with what the job would use beside it (nothing is created): the
    spec admitted as Create admits it, each refusal at its field."""
    text = form.get("spec", "")
    key = form.get("idempotency_key", "")[:MAX_KEY_CHARS] or str(uuid.uuid4())
    check = check_spec_text(text)
    if check.spec is None:
        return form_page(request, viewer, text, key, check.errors, status_code=422)
    try:
        estimate = await estimate_spec(
            session, viewer.team_id, check.spec, settings, prices, utcnow()
        )
    except SpecRefused as error:
        errors = at_field(text, error.param, error.message)
        return form_page(request, viewer, text, key, errors, status_code=422)
    return form_page(request, viewer, text, key, [], estimate=estimate)


@router.post("/new")
async def submit_job(
    request: Request,
    session: SessionDep,
    queue: QueueDep,
    settings: SettingsDep,
    viewer: ActingViewerDep,
    form: FormDep,
) -> Response:
    """Create the job (the form's idempotency key makes a repeat, e.g. a double click,
    return the same job) and go to its page; on errors show the form again. Needs a key
    with the `submit` scope; audited."""
    text = form.get("spec", "")
    key = form.get("idempotency_key", "")[:MAX_KEY_CHARS] or str(uuid.uuid4())
    check = check_spec_text(text)
    if check.spec is None:
        return form_page(request, viewer, text, key, check.errors, status_code=422)
    idempotency = Idempotency(key, "POST /ui/new", check.data)
    try:
        prices = PriceTable(settings.prices)
        await admit_spending(session, viewer.team_id, check.spec, prices, utcnow(), key)
        result = await submit_spec(
            session, viewer, queue, settings, check.spec, idempotency, DASHBOARD
        )
    except SpecRefused as error:
        errors = at_field(text, error.param, error.message)
        return form_page(request, viewer, text, key, errors, status_code=422)
    except (QueueFull, BudgetExceeded) as full:
        raise WebError(429, f"Not submitted: {full}.") from None
    except BudgetRefused as refused:
        errors = at_field(text, refused.param, str(refused))
        return form_page(request, viewer, text, key, errors, status_code=422)
    except TooLargeToStore as error:
        errors = [FieldError("spec", None, str(error))]
        return form_page(request, viewer, text, key, errors, status_code=422)
    return RedirectResponse(f"/ui/jobs/{result.job.id}", status_code=303)
