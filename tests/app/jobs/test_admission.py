"""Admission on a real database: a spec meets the rules in their listed order and is
refused at the first it breaks; a sweep's probes ask the database once per distinct set of
weights and files they name, however many probes there are; which parameter paths lie under an
`init_from`."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from app.auth.keys import Principal
from app.jobs.admission import NAME_RULES, TEAM_RULES, admit
from app.jobs.errors import SpecRefused
from app.jobs.store import claim_job, complete_job, create_job
from app.records.store import record_checkpoint
from app.sweeps.admission import admit_sweep, under_init_from
from app.sweeps.schemas import SweepCreate
from kernel.spec import JobSpec
from tests.app.conftest import small_spec


def test_the_rules_are_read_top_to_bottom_in_one_place() -> None:
    assert [rule.__name__ for rule in NAME_RULES] == [
        "files_under_data_root",
        "listed_tracker",
        "listed_teacher_server",
        "served_vllm_student",
        "loadable_model_names",
    ]
    assert [rule.__name__ for rule in TEAM_RULES] == [
        "fill_init_from",
        "weights_admitted",
        "fill_files",
        "fill_stored",
    ]


async def test_a_spec_is_refused_at_the_first_rule_it_breaks(session, key, settings) -> None:
    outside = {"source": "file", "path": "/etc/passwd.jsonl"}
    unknown_job = {"base_model": "tiny-teacher", "init_from": {"job": 999_999}}
    both = JobSpec.model_validate(small_spec(dataset=outside, teacher=unknown_job))
    only_team = JobSpec.model_validate(small_spec(teacher=unknown_job))

    with pytest.raises(SpecRefused) as first:
        await admit(session, key.team.id, both, settings)
    with pytest.raises(SpecRefused) as second:
        await admit(session, key.team.id, only_team, settings)

    assert first.value.param == "dataset.path"
    assert second.value.param.startswith("teacher.init_from")


def test_under_init_from_finds_the_field_below_each_init_from() -> None:
    assert under_init_from("student.init_from.job") == "job"
    assert under_init_from("teacher.init_from.path") == "path"
    assert under_init_from("teachers.mul.init_from.checkpoint") == "checkpoint"
    assert under_init_from("teacher.init_from") == ""
    for elsewhere in ("teachers.init_from.base_model", "optim.learning_rate", "student", "x"):
        assert under_init_from(elsewhere) is None, elsewhere


async def test_a_sweeps_probes_ask_the_database_once_per_weights_and_files_named(
    session, key, settings
):
    spec = JobSpec.model_validate(small_spec(backend="trio"))
    trained = (await create_job(session, key.team.id, spec)).job
    await claim_job(session, trained.id, "w", heartbeat_timeout=60)
    await record_checkpoint(session, trained.id, "w", 3, "final", "trio://fake/ours/final")
    await complete_job(session, trained.id, "w", "trio://fake/ours/final")
    teacher = {"base_model": "Qwen/Qwen3.5-4B", "init_from": {"job": trained.id}}

    def definition(rates: int) -> SweepCreate:
        values: list[Any] = [1e-4 * (n + 1) for n in range(rates)]
        return SweepCreate.model_validate(
            {
                "name": "batched",
                "base": small_spec(backend="trio", teacher=teacher),
                "parameters": {"optim.learning_rate": {"values": values}},
                "method": "random",
                "metric": {"name": "opd/reverse_kl_mean", "goal": "minimize"},
            }
        )

    async def statements(rates: int) -> int:
        executed: list[str] = []

        def count(*args: Any) -> None:
            executed.append(args[2])

        engine = session.bind.sync_engine
        event.listen(engine, "before_cursor_execute", count)
        try:
            await admit_sweep(session, Principal(key.team.id), definition(rates), settings)
        finally:
            event.remove(engine, "before_cursor_execute", count)
        return len(executed)

    assert await statements(100) == await statements(1)
