"""Requests that wait for a worker (the playground, checkpoint downloads) hold no database
connection while they wait: their reads are done first and the session's connection goes
back to the pool, so however many wait, every other request still gets one. Each team may
have only OPD_TEAM_MAX_WAITING such requests waiting at once in an API process; one more
is refused at once (a 429 with Retry-After) rather than piling up."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncSession

RETRY_AFTER_SECONDS = 5


class TooManyWaiting(Exception):
    """The team already has as many requests waiting here as it may."""


class Waits:
    """The requests each team has waiting in this process."""

    def __init__(self, per_team: int) -> None:
        self.per_team = per_team
        self.waiting: Counter[int] = Counter()

    @asynccontextmanager
    async def released(self, session: AsyncSession, team_id: int) -> AsyncIterator[None]:
        """Take one of the team's places (else TooManyWaiting) and close `session`, whose
        reads are done, for the wait inside the block."""
        if self.waiting[team_id] >= self.per_team:
            raise TooManyWaiting(
                "this team already has as many requests waiting for a worker as it may "
                f"({self.per_team}, OPD_TEAM_MAX_WAITING); retry in {RETRY_AFTER_SECONDS} s"
            )
        self.waiting[team_id] += 1
        try:
            await session.close()
            yield
        finally:
            self.waiting[team_id] -= 1
            if not self.waiting[team_id]:
                del self.waiting[team_id]
