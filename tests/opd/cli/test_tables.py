"""What `opd` prints for a person: model text with its control bytes escaped, a highest-KL
list without 0.000 padding, and job rows with a failed job's error on one line."""

from __future__ import annotations

from datetime import UTC, datetime

from app.jobs.schemas import JobError, JobPublic
from kernel.playground import Completion
from opd.cli.jobs import job_header, job_line
from opd.cli.outputs import completion_text
from opd.cli.shading import printable, shaded_tokens, worst_tokens
from tests.app.conftest import small_spec


def test_control_bytes_are_shown_as_escapes_not_obeyed():
    text = "ok\x1b[2J\x1b]0;pwned\x07\x00 end\n\tnext\x9b"
    shown = printable(text)
    assert shown == "ok\\x1b[2J\\x1b]0;pwned\\x07\\x00 end\n\tnext\\x9b"
    shaded = shaded_tokens(["\x1b[31m", "a"], [0.5, None])
    assert "\\x1b[31m" in shaded and "\x1b[31m" not in shaded.replace("\x1b[0m", "")


def test_the_highest_kl_list_leaves_out_what_prints_as_zero():
    tokens = ["a", "b", "c", "d", "e"]
    listed = worst_tokens(tokens, [0.8, -0.0001, 0.0, 0.0004, 1.5])
    assert listed == "'e' 1.500, 'a' 0.800"
    assert worst_tokens(["a", "b"], [-0.2, None]) == "none (no token above 0.000)"


def test_a_completion_without_a_terminal_escapes_its_text():
    completion = Completion.model_construct(
        text="hi\x00\x1b", tokens=["hi", "\x00", "\x1b"], reverse_kl=[0.2, -0.0, 0.0]
    )
    assert completion_text(completion, color=False) == (
        "hi\\x00\\x1b\nhighest reverse KL: 'hi' 0.200"
    )


def job(**fields: object) -> JobPublic:
    base = JobPublic.model_construct(
        id=14,
        team_id=3,
        name="tiny",
        status="failed",
        steps_done=2,
        total_steps=10,
        error=None,
        sweep_id=None,
        sweep_trial=None,
        stop_reason=None,
        spec=small_spec(),
        created_at=datetime.now(UTC),
    )
    return base.model_copy(update=fields)


def test_a_failed_jobs_row_shows_its_error_on_one_line_and_admins_get_a_team_column():
    error = {"code": "backend_error", "message": "Traceback (most recent call last):\n  File x"}
    failed = job(error=JobError(**error))
    row = job_line(failed)
    assert "\n" not in row
    assert row.endswith("tiny  [backend_error] Traceback (most recent call last): …")
    assert job_header().split() == ["id", "status", "steps", "name"]
    assert job_header({3: "research"}).split()[:2] == ["team", "id"]
    assert job_line(failed, {3: "research"}).split()[:2] == ["research", "14"]
