"""Stored completions: what the completions doors kept with `store: true`, read through
OpenAI's doors (`/v1/chat/completions`), and the feedback a team gives on them."""

from __future__ import annotations

from collections.abc import Mapping

from app.stored_completions.schemas import (
    FeedbackPublic,
    StoredCompletionRead,
    StoredCompletionsRead,
    StoredMessageRead,
    StoredMessagesRead,
)
from opd.sdk.resources.base import Resource, X, listed, operation, query
from opd.sdk.transport import Call, Listing, Steps, fetch

PATH = "/v1/chat/completions"


class StoredCompletions(Resource[X]):
    """The team's stored completions, their feedback, and the filters a job's
    `dataset.source: stored_completions` takes."""

    @listed(StoredCompletionRead)
    def list(
        self,
        *,
        model: str | None = None,
        metadata: Mapping[str, str] | None = None,
        rating: int | None = None,
        has_feedback: bool | None = None,
        newest_first: bool = False,
        page_size: int = 100,
    ) -> Listing:
        """Those every given filter picks (`metadata`: each pair held), oldest first."""
        labels = {f"metadata[{key}]": value for key, value in (metadata or {}).items()}
        params = query(
            model=model,
            rating=rating,
            has_feedback=None if has_feedback is None else str(has_feedback).lower(),
            order="desc" if newest_first else "asc",
            limit=page_size,
        )
        return Listing(Call("GET", PATH, params=params | labels), StoredCompletionsRead)

    @operation
    def get(self, completion_id: str) -> Steps[StoredCompletionRead]:
        """The completion with the feedback given on it."""
        return (yield from fetch(Call("GET", f"{PATH}/{completion_id}"), StoredCompletionRead))

    @listed(StoredMessageRead)
    def messages(self, completion_id: str) -> Listing:
        """The conversation it answered, first message first."""
        call = Call("GET", f"{PATH}/{completion_id}/messages", params={"limit": 100})
        return Listing(call, StoredMessagesRead)

    @operation
    def update(
        self, completion_id: str, metadata: Mapping[str, str] | None
    ) -> Steps[StoredCompletionRead]:
        """Replace its metadata (None: clear it)."""
        body = {"metadata": None if metadata is None else dict(metadata)}
        call = Call("POST", f"{PATH}/{completion_id}", json=body)
        return (yield from fetch(call, StoredCompletionRead))

    @operation
    def delete(self, completion_id: str) -> Steps[None]:
        """Delete it and its feedback."""
        yield Call("DELETE", f"{PATH}/{completion_id}")

    @operation
    def feedback(
        self,
        completion_id: str,
        *,
        rating: int | None = None,
        correction: str | None = None,
        author: str | None = None,
    ) -> Steps[FeedbackPublic]:
        """Rate it (-1, 0, 1), correct it (the answer it should have given, or a note on
        what was wrong: what `teacher.self` with `context: feedback` reads), or both."""
        body = query(rating=rating, correction=correction, author=author)
        call = Call("POST", f"{PATH}/{completion_id}/feedback", json=body, resendable=False)
        return (yield from fetch(call, FeedbackPublic))
