"""Stored completions on the dashboard: what the team's completions doors kept with
`store: true`, newest first a hundred a page, filtered by model, a metadata pair, a rating
and whether feedback was given; each with thumbs and a correction box, which give feedback
as `POST /v1/chat/completions/{id}/feedback` does (what a job with `teacher.self.context:
feedback` distils from)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.deps import SessionDep
from app.api.openai.stored import messages_of, stored_view
from app.api.routes.stored_completions import completion_of
from app.core.pages import Order
from app.stored_completions.errors import StoredCompletionNotFound
from app.stored_completions.schemas import FeedbackCreate
from app.stored_completions.store import add_feedback, feedback_on, get_completion, page_of
from app.stored_completions.tables import StoredCompletion
from app.web.deps import ActingViewerDep, FormDep, ViewerDep
from app.web.errors import WebError
from app.web.templating import render
from kernel.json_types import FORM_TEXT
from kernel.spec import format_validation_error
from kernel.spec.data import StoredCompletionFilter

router = APIRouter(prefix="/ui", include_in_schema=False)

LISTED = 100
FILTERS = ("model", "metadata", "rating", "feedback", "after")
"""The list's query fields (its filters and page), kept across a feedback form's answer."""
Text = Annotated[str, Query(max_length=600)]
CompletionId = Annotated[str, Path(max_length=64)]


def rating_of(text: str) -> int | str | None:
    """A rating field's text: its number (the model checks it is -1, 0 or 1), else as
    typed, so that the error quotes it."""
    text = text.strip()
    if not text:
        return None
    return int(text) if text.removeprefix("-").isdigit() else text


def wanted_of(model: str, metadata: str, rating: str, feedback: str) -> StoredCompletionFilter:
    """The page's filter fields as the list door's filter (a 400 page saying which field
    is wrong)."""
    labels: dict[str, str] = {}
    if metadata.strip():
        key, sep, value = metadata.strip().partition("=")
        if not sep or not key:
            raise WebError(400, "metadata: give KEY=VALUE, e.g. app=support")
        labels[key] = value
    try:
        return StoredCompletionFilter.model_validate(
            {
                "model": model.strip() or None,
                "metadata": labels,
                "rating": rating_of(rating),
                "has_feedback": {"yes": True, "no": False}.get(feedback),
            },
            context=FORM_TEXT,
        )
    except ValidationError as error:
        raise WebError(400, format_validation_error(error, StoredCompletionFilter)) from None


def row_view(row: StoredCompletion, given: Any) -> dict[str, Any]:
    """A row of the page: the last user turn it answered, the answer, its feedback."""
    asked = [m for m in messages_of(row) if m.role == "user"]
    return {
        "completion": stored_view(row, given),
        "created": row.created_at,
        "question": asked[-1].content if asked else "",
    }


async def cursor_of(session: AsyncSession, team_id: int, after: str) -> str | None:
    """The page's `after`: one of the team's stored completions (None: the newest page);
    any other id, or one no longer kept, is a 400 page that says so (another team's reads
    as one that is not there)."""
    after = after.strip()
    if not after:
        return None
    try:
        await get_completion(session, team_id, after)
    except StoredCompletionNotFound:
        raise WebError(
            400,
            f"after: {after} is none of your team's stored completions (deleted, or never "
            "kept): start again from the newest",
        ) from None
    return after


@router.get("/completions")
async def completions_page(
    request: Request,
    session: SessionDep,
    viewer: ViewerDep,
    model: Text = "",
    metadata: Text = "",
    rating: Text = "",
    feedback: Text = "",
    after: Annotated[str, Query(max_length=64)] = "",
) -> Response:
    """The team's stored completions the filters pick, newest first, a hundred a page:
    `after` one of them, those older than it ("Older →" links the next page, "Newest"
    back to the first, each with the filters)."""
    wanted = wanted_of(model, metadata, rating, feedback)
    cursor = await cursor_of(session, viewer.team_id, after)
    rows = await page_of(session, viewer.team_id, wanted, cursor, LISTED, Order.desc)
    shown = rows[:LISTED]
    given = await feedback_on(session, shown)
    filters = {"model": model, "metadata": metadata, "rating": rating, "feedback": feedback}
    kept = {name: value for name, value in filters.items() if value}
    context = {
        "viewer": viewer,
        "rows": [row_view(row, given) for row in shown],
        "more": len(rows) > LISTED,
        "filters": filters,
        "query": request.url.query,
        "older": urlencode(kept | {"after": shown[-1].public_id}) if len(rows) > LISTED else None,
        "newest": None if cursor is None else urlencode(kept),
    }
    return render(request, "completions.html", context)


@router.post("/completions/{completion_id}/feedback")
async def give_feedback(
    completion_id: CompletionId, session: SessionDep, viewer: ActingViewerDep, form: FormDep
) -> Response:
    """A thumb (`rating`), a correction, or both, on one of the team's stored completions;
    back to the list as it was filtered."""
    try:
        given = FeedbackCreate.model_validate(
            {
                "rating": rating_of(form.get("rating", "")),
                "correction": form.get("correction", "").strip() or None,
                "author": f"key {viewer.key_prefix}" if viewer.key_prefix else None,
            },
            context=FORM_TEXT,
        )
    except ValidationError as error:
        raise WebError(400, format_validation_error(error, FeedbackCreate)) from None
    row = await completion_of(session, viewer.team_id, completion_id)
    await add_feedback(session, row, given)
    kept = [(k, v) for k, v in parse_qsl(form.get("query", "")) if k in FILTERS]
    back = f"/ui/completions?{urlencode(kept)}" if kept else "/ui/completions"
    return RedirectResponse(f"{back}#{completion_id}", status_code=303)
