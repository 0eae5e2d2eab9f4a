"""Sweeps: create, read, list, cancel, estimate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import (
    Any,
)

from app.budgets.schemas import SweepEstimate
from app.sweeps.schemas import SweepCreate, SweepDetail, SweepPublic, SweepsPage
from opd.sdk.resources.base import Resource, X, listed, operation, written
from opd.sdk.transport import Call, Listing, Steps, fetch


class Sweeps(Resource[X]):
    """`/v1/sweeps`: searches over a job spec, whose trials are the team's jobs."""

    @operation
    def create(self, definition: SweepCreate | Mapping[str, Any]) -> Steps[SweepDetail]:
        """Start a sweep (a `SweepCreate`, or its fields as a mapping, e.g. a YAML file's).
        Not sent twice once it may have reached the API: the API keeps no idempotency
        record for sweeps, so a resent request could start a second one."""
        call = Call("POST", "/v1/sweeps", json=written(definition), resendable=False)
        return (yield from fetch(call, SweepDetail))

    @operation
    def estimate(self, definition: SweepCreate | Mapping[str, Any]) -> Steps[SweepEstimate]:
        """Every trial's estimate, their total and what early stopping may save, without
        creating the sweep (admitted as `create` admits it)."""
        call = Call("POST", "/v1/sweeps/estimate", json=written(definition))
        return (yield from fetch(call, SweepEstimate))

    @listed(SweepPublic)
    def list(self, *, page_size: int = 100) -> Listing:
        """The caller's sweeps (every team's for an admin key), newest first."""
        return Listing(Call("GET", "/v1/sweeps", params={"limit": page_size}), SweepsPage)

    @operation
    def get(self, sweep_id: int) -> Steps[SweepDetail]:
        """The sweep and its trials (values, status, metric, the best so far)."""
        return (yield from fetch(Call("GET", f"/v1/sweeps/{sweep_id}"), SweepDetail))

    @operation
    def cancel(self, sweep_id: int) -> Steps[SweepDetail]:
        """End the sweep and cancel its unfinished trials."""
        return (yield from fetch(Call("POST", f"/v1/sweeps/{sweep_id}/cancel"), SweepDetail))
