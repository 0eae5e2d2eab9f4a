"""OpenAI's stored-completion doors, so that the `openai` package lists, reads, labels and
deletes what the completions doors kept with `store: true`
(`client.chat.completions.list/retrieve/update/delete`, `.messages.list`), and this
service's own feedback door beside them. Each reads the caller's team's completions only:
another team's id answers as a missing one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app.api.deps import PrincipalDep, SessionDep
from app.api.errors import ApiError
from app.api.openai.errors import OpenAIRoute, openai_error_responses
from app.api.openai.stored import (
    MetadataUpdate,
    StoredChatCompletion,
    StoredChatCompletions,
    StoredCompletionDeleted,
    StoredMessages,
    messages_of,
    public_feedback,
    stored_view,
)
from app.api.routes.fine_tuning import METADATA_QUERY
from app.core.pages import Order
from app.stored_completions.errors import StoredCompletionNotFound
from app.stored_completions.schemas import FeedbackCreate, FeedbackPublic
from app.stored_completions.store import (
    add_feedback,
    delete_completion,
    feedback_on,
    get_completion,
    page_of,
    set_metadata,
)
from app.stored_completions.tables import StoredCompletion
from kernel.spec.data import StoredCompletionFilter

router = APIRouter(prefix="/v1/chat/completions", tags=["openai"], route_class=OpenAIRoute)

MAX_PAGE = 100
CompletionId = Annotated[
    str, Path(max_length=64, description="A stored completion's id, e.g. chatcmpl-...")
]
Cursor = Annotated[
    str | None,
    Query(max_length=80, description="A page's `last_id`: the page after it."),
]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
Ordering = Annotated[
    Order, Query(description="By creation time: `asc` oldest first (OpenAI's default).")
]
READ_RESPONSES = openai_error_responses(400, 401, 403, 404)


def not_found(completion_id: str) -> ApiError:
    return ApiError(
        404,
        "not_found",
        f"No stored completion {completion_id}, or it is another team's.",
        "completion_id",
    )


async def completion_of(session: SessionDep, team_id: int, completion_id: str) -> StoredCompletion:
    try:
        return await get_completion(session, team_id, completion_id)
    except StoredCompletionNotFound:
        raise not_found(completion_id) from None


@router.get("", response_model=StoredChatCompletions, responses=READ_RESPONSES)
async def list_stored_completions(
    request: Request,
    session: SessionDep,
    principal: PrincipalDep,
    model: Annotated[
        str | None, Query(max_length=64, description="Only those of this model.")
    ] = None,
    rating: Annotated[
        int | None,
        Query(ge=-1, le=1, description="Only those some feedback rated so (this service's own)."),
    ] = None,
    has_feedback: Annotated[
        bool | None,
        Query(description="true: only those with feedback; false: only those without."),
    ] = None,
    after: Cursor = None,
    limit: Limit = 20,
    order: Ordering = Order.asc,
) -> StoredChatCompletions:
    """The team's stored completions, oldest first (`order=desc`: newest first);
    `metadata[key]=value` keeps those whose metadata holds it, `model` those of a model;
    `rating` and `has_feedback` (this service's own filters) those with such feedback."""
    labels = {
        match.group(1): value
        for name, value in request.query_params.multi_items()
        if (match := METADATA_QUERY.match(name))
    }
    try:
        wanted = StoredCompletionFilter(
            model=model,
            metadata=labels,
            rating=rating,  # type: ignore[arg-type]
            has_feedback=has_feedback,
        )
    except ValidationError as error:
        raise RequestValidationError(
            [e | {"loc": ("query", *e["loc"])} for e in error.errors()]
        ) from None
    rows = await page_of(session, principal.team_id, wanted, after, limit, order)
    given = await feedback_on(session, rows)
    views = [stored_view(row, given) for row in rows]
    return StoredChatCompletions.of(views, limit, lambda completion: completion.id)


@router.get("/{completion_id}", response_model=StoredChatCompletion, responses=READ_RESPONSES)
async def retrieve_stored_completion(
    completion_id: CompletionId, session: SessionDep, principal: PrincipalDep
) -> StoredChatCompletion:
    """The stored completion, with the feedback given on it."""
    row = await completion_of(session, principal.team_id, completion_id)
    return stored_view(row, await feedback_on(session, [row]))


@router.post(
    "/{completion_id}",
    response_model=StoredChatCompletion,
    responses=openai_error_responses(400, 401, 403, 404),
)
async def update_stored_completion(
    completion_id: CompletionId,
    body: MetadataUpdate,
    session: SessionDep,
    principal: PrincipalDep,
) -> StoredChatCompletion:
    """Replace the completion's metadata (null: none); nothing else of it changes."""
    try:
        wanted = StoredCompletionFilter(metadata=body.metadata or {})
    except ValidationError as error:
        raise RequestValidationError(
            [e | {"loc": ("body", *e["loc"])} for e in error.errors()]
        ) from None
    row = await completion_of(session, principal.team_id, completion_id)
    row = await set_metadata(session, row, wanted.metadata)
    return stored_view(row, await feedback_on(session, [row]))


@router.delete("/{completion_id}", response_model=StoredCompletionDeleted, responses=READ_RESPONSES)
async def delete_stored_completion(
    completion_id: CompletionId, session: SessionDep, principal: PrincipalDep
) -> StoredCompletionDeleted:
    """Delete the completion and the feedback on it."""
    row = await completion_of(session, principal.team_id, completion_id)
    await delete_completion(session, row)
    return StoredCompletionDeleted(id=completion_id)


@router.get("/{completion_id}/messages", response_model=StoredMessages, responses=READ_RESPONSES)
async def list_stored_messages(
    completion_id: CompletionId,
    session: SessionDep,
    principal: PrincipalDep,
    after: Cursor = None,
    limit: Limit = 20,
    order: Ordering = Order.asc,
) -> StoredMessages:
    """The conversation the completion answered, first message first (`order=desc`: last
    first), those after the message `after`."""
    row = await completion_of(session, principal.team_id, completion_id)
    messages = messages_of(row)
    if order is Order.desc:
        messages.reverse()
    ids = [message.id for message in messages]
    start = ids.index(after) + 1 if after in ids else 0
    return StoredMessages.of(messages[start : start + limit + 1], limit, lambda m: m.id)


@router.post(
    "/{completion_id}/feedback",
    response_model=FeedbackPublic,
    responses=openai_error_responses(400, 401, 403, 404),
)
async def give_feedback(
    completion_id: CompletionId,
    body: FeedbackCreate,
    session: SessionDep,
    principal: PrincipalDep,
) -> FeedbackPublic:
    """This service's own door (OpenAI has none): a rating (-1, 0, 1), a correction (the
    answer it should have given, or a note on what was wrong) and who gave it. A
    completion takes several; they are listed with it (`feedback`), and a job distils from
    them (`dataset.source: stored_completions`, `teacher.self.context: feedback`)."""
    row = await completion_of(session, principal.team_id, completion_id)
    return public_feedback(row, await add_feedback(session, row, body))
