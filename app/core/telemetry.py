"""The API process's own instruments for Prometheus: request counts and latencies, and
failed sends to the queue. Process-wide (one registry per process, whatever the number of
apps a test makes); what the database and Redis hold is counted at scrape time instead
(`app/api/routes/prometheus.py`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

REQUESTS = Counter(
    "opd_http_requests",
    "HTTP requests answered, by method, route template and status.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "opd_http_request_duration_seconds",
    "Time until a response starts (a stream's first byte), by method, route and status.",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
QUEUE_ERRORS = Counter(
    "opd_queue_errors",
    "Calls to the Redis queue that failed or timed out, by operation (a job whose send "
    "failed waits in the database and is sent when Redis is back).",
    ["operation"],
    registry=REGISTRY,
)
