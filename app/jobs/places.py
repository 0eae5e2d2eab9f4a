"""Where each queued job stands, and why it waits: fair dispatch's rule (app/jobs/fairness.py)
played forward over the queue as it is, as if no job ended and none were submitted, gives
the order the queued jobs start in; the worker slots the live workers have say how many
start now. Pure: the rows come from app/jobs/workers.py."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from app.jobs.schemas import QueuePlace


@dataclass(frozen=True)
class Waiting:
    """A queued job as fair dispatch weighs it."""

    id: int
    team_id: int
    priority: int
    queued_at: datetime


@dataclass
class TeamQueue:
    """One team's queued jobs, in the order its own jobs start (priority, then longest
    waiting), and when its longest waiting job was queued."""

    jobs: list[Waiting]
    running: int
    limit: int
    next: int = 0
    waits_since: list[datetime] = field(default_factory=list)

    def key(self) -> tuple[int, datetime, int]:
        """Fair dispatch's order of teams: fewest running, longest waiting, lowest id."""
        return (self.running, self.waits_since[0], self.jobs[self.next].id)


def start_order(
    queued: Sequence[Waiting], running: Mapping[int, int], limits: Mapping[int, int]
) -> tuple[list[Waiting], set[int]]:
    """The queued jobs in the order fair dispatch starts them, were every slot free,
    no job to end and none to be submitted; then those a team's running limit holds back
    (each team's in its own order), whose ids are returned besides."""
    by_team: dict[int, list[Waiting]] = defaultdict(list)
    for job in queued:
        by_team[job.team_id].append(job)
    teams: list[tuple[tuple[int, datetime, int], int]] = []
    queues: dict[int, TeamQueue] = {}
    for team_id, jobs in by_team.items():
        jobs.sort(key=lambda job: (-job.priority, job.queued_at, job.id))
        queues[team_id] = TeamQueue(
            jobs,
            running.get(team_id, 0),
            limits[team_id],
            waits_since=sorted(job.queued_at for job in jobs),
        )
        if queues[team_id].running < queues[team_id].limit:
            teams.append((queues[team_id].key(), team_id))
    heapq.heapify(teams)
    order: list[Waiting] = []
    while teams:
        _, team_id = heapq.heappop(teams)
        team = queues[team_id]
        started = team.jobs[team.next]
        order.append(started)
        team.next += 1
        team.running += 1
        team.waits_since.remove(started.queued_at)
        if team.next < len(team.jobs) and team.running < team.limit:
            heapq.heappush(teams, (team.key(), team_id))
    held = [job for team in queues.values() for job in team.jobs[team.next :]]
    return order + held, {job.id for job in held}


@dataclass(frozen=True)
class QueueBoard:
    """The queue as one read saw it: the order queued jobs start in (`start_order`), the
    jobs each team runs, and the slots of the live workers (None: no worker was seen)."""

    positions: dict[int, int]
    """Each queued job's place (1: the next to start)."""
    ahead_in_team: dict[int, int]
    """Each queued job's team's jobs that start before it."""
    held: set[int]
    """The queued jobs that their team's running limit holds back."""
    running: dict[int, int]
    """Jobs each team runs now."""
    slots: int | None

    @classmethod
    def of(
        cls,
        order: Sequence[Waiting],
        held: set[int],
        running: dict[int, int],
        slots: int | None,
    ) -> QueueBoard:
        seen: dict[int, int] = defaultdict(int)
        ahead_in_team = {}
        for job in order:
            ahead_in_team[job.id] = seen[job.team_id]
            seen[job.team_id] += 1
        positions = {job.id: place for place, job in enumerate(order, start=1)}
        return cls(positions, ahead_in_team, held, running, slots)

    def place(self, job_id: int, team_id: int) -> QueuePlace:
        position = self.positions.get(job_id)
        running = sum(self.running.values())
        return QueuePlace(
            position=position,
            ahead=len(self.positions) if position is None else position - 1,
            ahead_in_team=self.ahead_in_team.get(job_id, 0),
            running=running,
            running_in_team=self.running.get(team_id, 0),
            slots=self.slots,
            held_by_team_limit=job_id in self.held,
        )


def jobs(count: int, verb: str) -> str:
    """`1 job runs`, `2 jobs run`."""
    return f"{count} job{'s' * (count != 1)} {verb}{'s' * (count == 1)}"


def waiting_reason(place: QueuePlace) -> str:
    """Why a queued job waits, in one line: the worker slots and what holds them, and the
    queued jobs that start before it (its team's among them)."""
    if place.position is None:
        ahead = f"more than {place.ahead} queued jobs start before it"
    else:
        ahead = f"{jobs(place.ahead, 'start')} before it ({place.ahead_in_team} of its team's)"
    if place.held_by_team_limit:
        return (
            f"Its team runs {place.running_in_team} jobs, as many as it may at once: it starts "
            f"when one of them ends; {ahead}"
        )
    where = f"; position {place.position} in the queue" if place.position is not None else ""
    runs = (
        f"{jobs(place.running, 'run')} now ({place.running_in_team} of its team's, "
        f"{place.running - place.running_in_team} of other teams')"
    )
    if place.slots is None:
        return f"No worker is running: it starts when one does; {runs}; {ahead}{where}"
    free = max(0, place.slots - place.running)
    if place.position is not None and place.position <= free:
        return f"Starting: {free} of {place.slots} worker slots are free"
    return f"Waiting for a worker slot: the workers have {place.slots}, and {runs}; {ahead}{where}"
