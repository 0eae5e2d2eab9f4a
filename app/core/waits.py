"""Requests that hold places in an API process for a long while: those that wait for a
worker (the playground, checkpoint downloads) and metric streams. They hold no database
connection meanwhile: their reads are done first and the session's connection goes back to
the pool, so however many there are, every other request still gets one. Each team may
hold only so many places of a kind at once in an API process (OPD_TEAM_MAX_WAITING
completions waiting for a worker: a request takes one per completion it asks for, so a list
of 64 prompts takes 64; OPD_TEAM_MAX_STREAMS streams, one each; streams also OPD_MAX_STREAMS
in all; the bytes of uploads arriving, OPD_TEAM_MAX_SPOOL_BYTES and OPD_MAX_SPOOL_BYTES); one
more is refused at once (a 429 with Retry-After) rather than piling up."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

RETRY_AFTER_SECONDS = 5


class TooManyWaiting(Exception):
    """The team (or the whole process) already holds as many places of a kind here as it
    may."""


@dataclass(frozen=True)
class Limit:
    count: int
    setting: str
    """The variable that sets it, named in a refusal."""


class Places:
    """The places of one kind (`what`, as a refusal says it) each team holds in this
    process: at most `per_team` of one team, and at most `in_all` together."""

    def __init__(self, what: str, per_team: Limit, in_all: Limit | None = None) -> None:
        self.what = what
        self.per_team = per_team
        self.in_all = in_all
        self.held: Counter[int] = Counter()

    def take(self, team_id: int, count: int = 1) -> None:
        """Take `count` of the team's places (bytes, for uploads), else TooManyWaiting."""
        if self.held[team_id] + count > self.per_team.count:
            raise self.refusal("this team already has", self.held[team_id], count, self.per_team)
        if self.in_all is not None and self.held.total() + count > self.in_all.count:
            raise self.refusal(
                "this API process already has", self.held.total(), count, self.in_all
            )
        self.held[team_id] += count

    def give_back(self, team_id: int, count: int = 1) -> None:
        self.held[team_id] -= count
        if not self.held[team_id]:
            del self.held[team_id]

    def refusal(self, who: str, held: int, count: int, limit: Limit) -> TooManyWaiting:
        asked = "" if count == 1 else f": {held} held, and this request asks for {count}"
        return TooManyWaiting(
            f"{who} as many {self.what} as it may ({limit.count}, {limit.setting}){asked}; "
            f"retry in {RETRY_AFTER_SECONDS} s"
        )


class Waits:
    """The completions (and downloads) each team has waiting for a worker in this process."""

    def __init__(self, per_team: int) -> None:
        self.places = Places(
            "completions and downloads waiting for a worker",
            Limit(per_team, "OPD_TEAM_MAX_WAITING"),
        )

    @property
    def per_team(self) -> int:
        return self.places.per_team.count

    @asynccontextmanager
    async def released(
        self, session: AsyncSession, team_id: int, count: int = 1
    ) -> AsyncIterator[None]:
        """Take `count` of the team's places (else TooManyWaiting) and close `session`,
        whose reads are done, for the wait inside the block."""
        self.places.take(team_id, count)
        try:
            await session.close()
            yield
        finally:
            self.places.give_back(team_id, count)
