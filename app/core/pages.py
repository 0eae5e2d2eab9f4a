"""A page of a listing, the same shape for every listing the API returns."""

from typing import Generic, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    data: list[T]
    next_cursor: int | None = None
