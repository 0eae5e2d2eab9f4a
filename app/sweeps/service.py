"""Creating a sweep, the same use case for every door: admitted (app/sweeps/admission.py),
stored and audited."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.audit.store import record_audit
from app.auth.keys import Principal
from app.core.config import Settings
from app.jobs.service import Door
from app.sweeps.admission import admit_sweep
from app.sweeps.schemas import SweepCreate
from app.sweeps.store import create_sweep
from app.sweeps.tables import Sweep


async def submit_definition(
    session: AsyncSession, principal: Principal, body: SweepCreate, settings: Settings, door: Door
) -> Sweep:
    """Admit a sweep and store it; the workers' controller starts its trials. Raises
    SpecRefused, or JobNotFound for a `base_job` the caller cannot read."""
    definition = await admit_sweep(session, principal, body, settings)
    sweep = await create_sweep(
        session, principal.team_id, definition, settings.max_spec_bytes, commit=False
    )
    await record_audit(
        session, principal, "sweep.create", f"sweep {sweep.id}", door.status_code, door.detail
    )
    return sweep
