"""What `opd` prints for a person: model text with its control bytes escaped, a highest-KL
list without 0.000 padding, and job rows with a failed job's error on one line."""

from __future__ import annotations

from datetime import UTC, datetime

from app.jobs.schemas import CheckpointPublic, JobError, JobPublic
from kernel.playground import Completion
from kernel.spec import JobSpec
from kernel.summary import Change, JobSummary
from opd.cli.jobs import compare_lines, job_header, job_line
from opd.cli.outputs import completion_text, model_card
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
        spec=JobSpec.model_validate(small_spec()),
        created_at=datetime(2026, 12, 2, 9, 30, tzinfo=UTC),
        summary=JobSummary(),
    )
    return base.model_copy(update=fields)


def test_a_failed_jobs_row_shows_its_error_on_one_line_and_admins_get_a_team_column():
    error = {"code": "backend_error", "message": "Traceback (most recent call last):\n  File x"}
    failed = job(error=JobError(**error))
    row = job_line(failed)
    assert "\n" not in row
    assert row.endswith("tiny  [backend_error] Traceback (most recent call last): …")
    assert job_header().split() == [
        "id",
        "status",
        "steps",
        "created",
        "(UTC)",
        "last",
        "eval",
        "name",
    ]
    assert "2026-12-02 09:30  -" in row
    assert job_header({3: "research"}).split()[:2] == ["team", "id"]
    assert job_line(failed, {3: "research"}).split()[:2] == ["research", "14"]


def test_a_jobs_row_shows_its_last_eval() -> None:
    graded = job(summary=JobSummary(eval_accuracy=Change(first=0.01, last=0.56)))
    assert "accuracy 56%" in job_line(graded)
    scored = job(summary=JobSummary(eval_reverse_kl=Change(first=1.2, last=0.734)))
    assert "reverse KL 0.734" in job_line(scored)


def test_compare_shows_figures_and_only_the_spec_fields_that_differ() -> None:
    slow = job(id=1, name="slow", status="succeeded", steps_done=10)
    fast = job(
        id=2,
        name="fast",
        status="succeeded",
        steps_done=10,
        spec=JobSpec.model_validate(small_spec(optim={"learning_rate": 1e-3})),
        summary=JobSummary(eval_accuracy=Change(first=0.01, last=0.56)),
    )
    lines = compare_lines([slow, fast])
    rows = {line.split("  ")[0]: line for line in lines}
    assert rows["job"].split()[1:] == ["1", "slow", "2", "fast"]
    assert "0.01 -> 0.56" in rows["held-out accuracy"]
    assert [key for key in rows if "." in key] == ["optim.learning_rate"]
    assert rows["optim.learning_rate"].split()[-1] == "0.001"


def test_an_exported_folder_says_what_it_was_trained_from_and_how_to_prompt_it() -> None:
    trained = job(
        id=12,
        status="succeeded",
        spec=JobSpec.model_validate(
            small_spec(
                student={"base_model": "tiny-student"},
                teacher={"base_model": "tiny-teacher"},
                dataset={"source": "inline", "prompts": ["1+1?"], "question_suffix": " Q"},
            )
        ),
        summary=JobSummary(eval_accuracy=Change(first=0.1, last=0.5)),
    )
    weights = CheckpointPublic.model_construct(id=3, step=3, kind="final")

    card = model_card(trained, weights, merged=False)

    assert card.startswith("---\nbase_model: tiny-student\nlibrary_name: peft\n---")
    assert "job 12's final weights after step 3" in card and "from `tiny-teacher`" in card
    assert "each followed by ' Q', rendered by the chat template of `tiny-student`" in card
    assert "- accuracy (held-out prompts): 0.1000 -> 0.5000" in card
    assert not model_card(trained, weights, merged=True).startswith("---")
