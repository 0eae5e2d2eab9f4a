"""A sweep is admitted whole: its size bounded, no parameter under an `init_from` but its
job and checkpoint, then every probe (each grid point, else each listed value and range
end) through the one admission of a job (app/jobs/admission.py), parsed off the event
loop and checked against the database once per distinct set of weights and files it
names."""

from __future__ import annotations

from dataclasses import replace

import anyio.to_thread
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.keys import Principal
from app.core.config import Settings
from app.jobs.admission import admit, check_names, database_named, problems_of, with_weights
from app.jobs.continuation import editable
from app.jobs.errors import SpecRefused
from app.jobs.rows import get_job
from app.sweeps.schemas import SweepCreate, SweepMethod
from app.sweeps.search import Values, extremes, grid, grid_size, trial_spec
from kernel.spec import JobSpec, SpecError, parse_spec

SWEPT_INIT_FROM = ("job", "checkpoint")


async def admit_sweep(
    session: AsyncSession, principal: Principal, body: SweepCreate, settings: Settings
) -> SweepCreate:
    """The definition as it is stored, `base` the admitted spec every trial starts from
    (the one given, or `base_job`'s, a job the caller may read) without the paths the
    service fills (it fills them again for each trial); SpecRefused naming what to change
    (JobNotFound for a `base_job` the caller cannot read)."""
    check_parameters(body, settings)
    base = await sweep_base(session, principal, body, settings)
    definition = body.model_copy(update={"base": base})
    await check_probes(session, principal.team_id, definition, settings)
    return definition


def check_parameters(body: SweepCreate, settings: Settings) -> None:
    """What the parameters alone may not be: too many values, a path under an `init_from`
    other than its job and checkpoint, a grid larger than max_trials."""
    given = sum(len(p.values) if p.values is not None else 2 for p in body.parameters.values())
    if given > settings.sweep_max_values:
        raise SpecRefused(
            "parameters",
            f"the parameters give {given} values in all (a range counts its two ends), more "
            f"than the {settings.sweep_max_values} a sweep may have (OPD_SWEEP_MAX_VALUES)",
        )
    for path in body.parameters:
        under = under_init_from(path)
        if under is not None and under not in SWEPT_INIT_FROM:
            raise SpecRefused(
                f"parameters.{path}",
                "only init_from.job and init_from.checkpoint may be swept: the service fills "
                "the rest of an init_from from them",
            )
    if body.method is SweepMethod.grid and (size := grid_size(body)) > body.max_trials:
        raise SpecRefused(
            "max_trials",
            f"the grid has {size} points, more than max_trials ({body.max_trials}); raise "
            "max_trials or give fewer values",
        )


def under_init_from(path: str) -> str | None:
    """The part of a dotted path below an `init_from` (`student.init_from`,
    `teacher.init_from`, `teachers.<name>.init_from`; "" for the init_from itself), or None
    for a path elsewhere."""
    parts = path.split(".")
    at = 2 if parts[0] == "teachers" else 1
    if parts[0] not in ("student", "teacher", "teachers") or len(parts) <= at:
        return None
    return ".".join(parts[at + 1 :]) if parts[at] == "init_from" else None


async def sweep_base(
    session: AsyncSession, principal: Principal, body: SweepCreate, settings: Settings
) -> dict[str, object]:
    """The base spec admitted for the caller's team, without its service-filled paths."""
    if body.base_job is not None:
        data = editable((await get_job(session, body.base_job, principal.scope)).spec)
    else:
        assert body.base is not None
        data = body.base
    try:
        spec = parse_spec(data)
    except SpecError as error:
        raise problems_of(error, "base") from None
    try:
        spec = await admit(session, principal.team_id, spec, settings)
    except SpecRefused as refused:
        raise SpecRefused(f"base.{refused.param}", refused.message) from None
    return editable(spec.model_dump(mode="json"))


async def check_probes(
    session: AsyncSession, team_id: int, definition: SweepCreate, settings: Settings
) -> None:
    """Every grid point (else every listed value and range end) makes a spec the team may
    submit. Parsing them is CPU work, done in a thread so that other requests go on; the
    database is asked once per distinct set of weights and files the probes name."""
    probes = grid(definition) if definition.method is SweepMethod.grid else extremes(definition)
    specs = await anyio.to_thread.run_sync(probe_specs, definition, probes, settings)
    checked: set[str] = set()
    for values, spec in specs:
        if (named := database_named(spec)) in checked:
            continue
        try:
            await with_weights(session, team_id, spec, settings)
        except SpecRefused as refused:
            raise blamed(refused, values) from None
        checked.add(named)


def probe_specs(
    definition: SweepCreate, probes: list[Values], settings: Settings
) -> list[tuple[Values, JobSpec]]:
    """Each probe's spec, checked for what needs no database."""
    assert definition.base is not None
    specs = []
    for values in probes:
        spec = trial_spec(definition.base, values, definition.name)
        try:
            check_names(spec, settings)
        except SpecRefused as refused:
            raise blamed(refused, values) from None
        specs.append((values, spec))
    return specs


def blamed(refused: SpecRefused, values: Values) -> SpecRefused:
    """The refusal as one of the parameter whose value it is about, where there is one (of
    the same kind: a file of no team of the caller's is a 404 as in a job)."""
    for param, value in values.items():
        if refused.param == param or refused.param.startswith(f"{param}."):
            return replace(
                refused, param=f"parameters.{param}", message=f"{value!r}: {refused.message}"
            )
    return refused
