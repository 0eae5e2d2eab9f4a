"""What every resource is made of: an operation written once as `Steps` (transport.py) and
run by the client it is reached through (`operation`, `listing`), and the helpers that
build its requests."""

from __future__ import annotations

import functools
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    TypeVar,
    overload,
)

from pydantic import BaseModel

from opd.sdk.transport import AsyncTransport, Listing, Steps, SyncTransport

P = ParamSpec("P")


T = TypeVar("T")


X = TypeVar("X", SyncTransport, AsyncTransport)


MetricNames = str | Sequence[str] | None


UNSET: Any = object()
"""A limit left as it is (None sets it back to the service's default)."""


class Resource(Generic[X]):
    def __init__(self, client: Any, transport: X) -> None:
        self._client = client
        self._transport = transport


class operation(Generic[P, T]):
    """A method written as `Steps`: called on a blocking client's resource it returns the
    result; on an asyncio client's resource, a coroutine of it."""

    via = "run"
    """The transport's method that carries out what the method returns."""

    def __init__(
        self,
        method: Callable[Concatenate[Any, P], Steps[T]] | Callable[Concatenate[Any, P], Listing],
    ) -> None:
        self.method = method
        functools.update_wrapper(self, method)

    @overload
    def __get__(self, resource: Resource[SyncTransport], owner: Any) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, resource: Resource[AsyncTransport], owner: Any
    ) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, resource: Any, owner: Any) -> Any:
        if resource is None:
            return self
        carry_out = getattr(resource._transport, self.via)

        @functools.wraps(self.method)
        def call(*args: Any, **kwargs: Any) -> Any:
            return carry_out(self.method(resource, *args, **kwargs))

        return call


class listing(operation[P, T]):
    """A list method (it returns the first page's `Listing`): an iterator over every item,
    page after page (an async iterator through an asyncio client)."""

    via = "iterate"

    if TYPE_CHECKING:

        @overload  # type: ignore[override]
        def __get__(
            self, resource: Resource[SyncTransport], owner: Any
        ) -> Callable[P, Iterator[T]]: ...
        @overload
        def __get__(
            self, resource: Resource[AsyncTransport], owner: Any
        ) -> Callable[P, AsyncIterator[T]]: ...
        def __get__(self, resource: Any, owner: Any) -> Any: ...


def listed(kind: type[T]) -> Callable[[Callable[Concatenate[Any, P], Listing]], listing[P, T]]:
    """`@listed(EventPublic)`: a `listing` of that item type."""
    return lambda first: listing(first)


def names(keys: MetricNames) -> str | None:
    return keys if keys is None or isinstance(keys, str) else ",".join(keys)


def query(**params: Any) -> dict[str, Any]:
    """The parameters that were given (None is left out)."""
    return {name: value for name, value in params.items() if value is not None}


def written(body: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """A request's body as the caller wrote it: a model's fields that were set (the rest
    are the service's to fill), or the mapping's."""
    if isinstance(body, BaseModel):
        return body.model_dump(mode="json", exclude_unset=True)
    return dict(body)


def renamed(old: str, new: str) -> None:
    """The note an old spelling gives for the one release it is still accepted."""
    warnings.warn(
        f"{old} is deprecated and goes in the next release: use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


def idempotency(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key} if key else {}
