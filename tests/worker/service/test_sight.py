"""The rule that keeps a database outage from making live jobs look dead: heartbeats are
judged only over a whole heartbeat timeout in which the process saw the database (every
contact succeeded, none too long after the one before)."""

from __future__ import annotations

from worker.service.sight import DatabaseSight, blind_after

TIMEOUT = 60.0


def seen_every(sight: DatabaseSight, start: float, end: float, step: float) -> None:
    at = start
    while at <= end:
        sight.saw(at)
        at += step


def test_nothing_is_judged_before_the_process_has_seen_the_database_for_a_timeout() -> None:
    sight = DatabaseSight(blind_after=30)
    assert not sight.watched_for(TIMEOUT, now=0)
    seen_every(sight, 0, 50, 10)
    assert not sight.watched_for(TIMEOUT, now=50)
    seen_every(sight, 60, 60, 10)
    assert sight.watched_for(TIMEOUT, now=60)


def test_after_a_failed_contact_the_timeout_counts_from_the_first_contact_back() -> None:
    sight = DatabaseSight(blind_after=30)
    seen_every(sight, 0, 100, 10)
    sight.missed()  # Postgres restarts at 105
    assert not sight.watched_for(TIMEOUT, now=110)
    sight.saw(200)  # back after 95 s: longer than the timeout
    assert not sight.watched_for(TIMEOUT, now=200)
    seen_every(sight, 210, 250, 10)
    assert not sight.watched_for(TIMEOUT, now=250), "a live worker still has time to beat"
    seen_every(sight, 260, 260, 10)
    assert sight.watched_for(TIMEOUT, now=260)


def test_a_contact_that_hung_counts_as_an_outage() -> None:
    """A restart the process never saw fail (its query waited until the database was
    back) is a gap longer than blind_after between two contacts."""
    sight = DatabaseSight(blind_after=30)
    seen_every(sight, 0, 100, 10)
    sight.saw(190)  # the pass that began at 110 answered at 190
    assert not sight.watched_for(TIMEOUT, now=190)
    seen_every(sight, 200, 250, 10)
    assert sight.watched_for(TIMEOUT, now=250)


def test_a_gap_that_is_still_open_counts_as_not_seeing() -> None:
    """A slot that takes a message over while the requeuer's last contact is long ago (it
    hangs on a database that is away) judges nothing."""
    sight = DatabaseSight(blind_after=30)
    seen_every(sight, 0, 100, 10)
    assert sight.watched_for(TIMEOUT, now=120)
    assert not sight.watched_for(TIMEOUT, now=131)


def test_a_short_gap_keeps_the_sight() -> None:
    sight = DatabaseSight(blind_after=30)
    seen_every(sight, 0, 40, 10)
    sight.saw(70)  # 30 s since the last: not more than blind_after
    assert sight.watched_for(TIMEOUT, now=70)


def test_blind_after_is_half_the_timeout_but_two_passes_at_least() -> None:
    assert blind_after(60, 10) == 30
    assert blind_after(4, 1) == 2
    assert blind_after(10, 8) == 16  # passes further apart than half the timeout
