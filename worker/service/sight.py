"""What a worker process saw of the database, so that an outage does not make live jobs
look dead.

A missing heartbeat means a dead worker only over time the database could take one: while
Postgres restarts, no worker can write, and a heartbeat older than the timeout says
nothing. So a process judges heartbeats (the requeuer sends a stale job again, a slot
takes one over) only once it has seen the database throughout the last heartbeat timeout:
every contact in that window succeeded, none more than `blind_after` seconds after the
one before (a contact that hung, or a process that was not looking, counts as not seeing).
After an outage, live workers beat again within their interval and nothing is taken over;
a worker that died is taken over one timeout after the database is back.

Pure: the clock (monotonic seconds) is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass


def blind_after(heartbeat_timeout: float, requeue_interval: float) -> float:
    """The longest gap between two contacts that still counts as seeing: half the
    timeout (an outage shorter than that leaves a live worker time to beat again), but
    never less than two requeuer passes apart, or heartbeats would never be judged."""
    return max(heartbeat_timeout / 2, 2 * requeue_interval)


@dataclass
class DatabaseSight:
    """The process's view, on the monotonic clock: since when it has seen the database
    without a break (`seen_since`), and when it last did (`last_seen`)."""

    blind_after: float
    seen_since: float | None = None
    last_seen: float | None = None

    def saw(self, at: float) -> None:
        """A contact that succeeded, ending at `at`. After a failure, or a gap longer than
        `blind_after` (the contact hung, or none was made), seeing starts again at `at`."""
        if self.last_seen is None or at - self.last_seen > self.blind_after:
            self.seen_since = at
        self.last_seen = at

    def missed(self) -> None:
        """A contact that failed: the database may be away since the last one."""
        self.seen_since = self.last_seen = None

    def watched_for(self, seconds: float, now: float) -> bool:
        """Whether the database has been in sight for the last `seconds` up to `now`: only
        then does a heartbeat older than `seconds` mean its worker died."""
        if self.seen_since is None or self.last_seen is None:
            return False
        return now - self.seen_since >= seconds and now - self.last_seen <= self.blind_after
