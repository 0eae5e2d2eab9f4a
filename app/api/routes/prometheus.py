"""`GET /metrics` for Prometheus: this process's request counts and latencies and queue
errors, plus what the database and Redis hold, counted at scrape time. Every label is
bounded (statuses, route templates, methods): never a job id.

Access: an admin key (or an admin's dashboard session), or, without any key, on the
separate address OPD_METRICS_LISTEN (see `metrics_listener`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from app.api.deps import PrincipalDep, needs
from app.auth.schemas import Scope
from app.core.queue import JobQueue, QueueUnavailable
from app.core.telemetry import REGISTRY
from app.monitoring.stats import ServiceStats, service_stats

router = APIRouter()

WINDOW_SECONDS = 60.0
STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Scrape(Collector):
    """The process's registry followed by the families read for this scrape."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        yield from self.families


def up(name: str, what: str, value: bool) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, f"1 when {what} answered this scrape, else 0.", value=value)


def stats_families(stats: ServiceStats) -> list[Metric]:
    jobs = GaugeMetricFamily("opd_jobs", "Jobs by status (every team).", labels=["status"])
    for status, count in stats.jobs_by_status.items():
        jobs.add_metric([status], count)
    seconds = stats.recent_step_seconds
    buckets = [(str(bound), sum(1 for s in seconds if s <= bound)) for bound in STEP_BUCKETS]
    buckets.append(("+Inf", len(seconds)))
    return [
        jobs,
        GaugeMetricFamily(
            "opd_jobs_waiting_for_queue",
            "Queued jobs whose message could not be sent to Redis yet (queue_reason set).",
            value=stats.jobs_waiting_for_queue,
        ),
        GaugeMetricFamily(
            "opd_workers_live",
            "Workers holding a job whose heartbeat is fresh (idle workers are not counted).",
            value=stats.live_workers,
        ),
        GaugeMetricFamily(
            "opd_steps_per_second",
            f"Training steps recorded per second over the last {WINDOW_SECONDS:.0f} s.",
            value=stats.recent_steps / WINDOW_SECONDS,
        ),
        GaugeHistogramMetricFamily(
            "opd_step_duration_seconds",
            f"Wall time of the steps recorded in the last {WINDOW_SECONDS:.0f} s "
            "(time/step_elapsed_time).",
            buckets=buckets,
            gsum_value=sum(seconds),
        ),
    ]


async def scrape(state: Any) -> bytes:
    """The exposition text; a database or Redis that does not answer shows as `*_up 0`."""
    families: list[Metric] = []
    try:
        async with state.sessions() as session:
            stats = await asyncio.wait_for(
                service_stats(session, state.settings.heartbeat_timeout, WINDOW_SECONDS),
                state.settings.connect_timeout,
            )
        families += [up("opd_database_up", "the database", True), *stats_families(stats)]
    except (SQLAlchemyError, OSError, TimeoutError):
        families.append(up("opd_database_up", "the database", False))
    queue: JobQueue = state.queue
    try:
        length = await queue.length()
        families += [
            up("opd_redis_up", "Redis", True),
            GaugeMetricFamily(
                "opd_queue_length", "Messages waiting in the Redis queue.", value=length
            ),
        ]
    except QueueUnavailable:
        families.append(up("opd_redis_up", "Redis", False))
    return generate_latest(Scrape(families))  # type: ignore[arg-type]


@router.get("/metrics", include_in_schema=False, openapi_extra=needs(Scope.admin))
async def prometheus_metrics(request: Request, principal: PrincipalDep) -> Response:
    """Prometheus text format; needs an admin key."""
    return Response(await scrape(request.app.state), media_type=CONTENT_TYPE_LATEST)
