"""A page of a listing: this service's shape (`Page`: `data` and `next_cursor`), and OpenAI's
(`ObjectList`: `object`, `data`, `first_id`, `last_id`, `has_more`) for the lists at doors
OpenAI has (files, models), which the `openai` package pages through as it does OpenAI's."""

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, Field

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    data: list[T]
    next_cursor: int | None = None

    def cursor(self) -> int | str | None:
        """What the next page's `after` is (None: this page is the last)."""
        return self.next_cursor


class Order(StrEnum):
    """OpenAI's `order` of a list: by creation time, newest first (`desc`) or oldest."""

    asc = "asc"
    desc = "desc"


class ObjectList(BaseModel, Generic[T]):
    """One page in OpenAI's list shape: while `has_more`, pass `last_id` as `after` for the
    next page (what the `openai` package's pagination does)."""

    object: Literal["list"] = "list"
    data: list[T]
    first_id: str | None = Field(None, description="The id of the page's first item.")
    last_id: str | None = Field(
        None, description="The id of the page's last item: the next page's `after`."
    )
    has_more: bool = Field(False, description="More items follow this page.")

    @classmethod
    def of(cls, read: Sequence[T], limit: int, ident: Callable[[T], str], **more: Any) -> Self:
        """The page of `limit` items from `read`, the up to `limit + 1` items a query
        returned (one more than the page holds says that more follow)."""
        shown = list(read[:limit])
        return cls(
            data=shown,
            first_id=ident(shown[0]) if shown else None,
            last_id=ident(shown[-1]) if shown else None,
            has_more=len(read) > limit,
            **more,
        )

    def cursor(self) -> int | str | None:
        return self.last_id if self.has_more else None
