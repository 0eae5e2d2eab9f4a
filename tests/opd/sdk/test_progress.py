"""What `opd watch` (the SDK's `wait(progress=True)`) shows of a job: its reverse KL by the
metric's name (the short `reverse_kl` it showed was no name `opd metrics --keys` knew), the
time left its engine paces with the evals in it, a held-out eval's prompts on a bar of their
own, and once, why a queued job waits."""

from __future__ import annotations

from app.jobs.schemas import JobPublic, JobStatus, QueuePlace
from kernel.progress import JobProgress, Phase
from opd.sdk.progress import Progress

WAITING = "Waiting for a worker slot: the workers have 1, and 1 job runs now"


def test_the_bars_show_what_the_job_does_and_the_time_left(capsys):
    base = JobPublic.model_construct(id=7, name="j", total_steps=10, steps_done=0, progress=None)
    place = QueuePlace(
        position=1,
        ahead=0,
        ahead_in_team=0,
        running=1,
        running_in_team=0,
        slots=1,
        held_by_team_limit=False,
    )
    queued = base.model_copy(
        update={"status": JobStatus.queued, "queue": place, "queue_reason": WAITING}
    )
    evaluating = JobProgress(
        phase=Phase.evaluating, step=0, eval_done=12, eval_total=40, eta_seconds=185.0
    )
    running = base.model_copy(
        update={"status": JobStatus.running, "queue": None, "queue_reason": None}
    )

    bars = Progress(queued)
    bars.show(queued, None)
    bars.show(queued, None)
    bars.show(running.model_copy(update={"progress": evaluating}), None)
    shown_eval = capsys.readouterr()
    trained = JobProgress(phase=Phase.training, step=3, eta_seconds=65.0)
    bars.show(running.model_copy(update={"progress": trained, "steps_done": 3}), 0.5)
    bars.close()
    shown = capsys.readouterr().err

    assert shown_eval.err.count(f"job 7 waits: {WAITING}") == 1
    assert "job 7 queued (#1)" in shown_eval.err
    assert "held-out eval after step 0" in shown_eval.err and "12/40" in shown_eval.err
    assert "left=3m 05s" in shown_eval.err
    assert "job 7 training step 3" in shown and "3/10" in shown
    assert "opd/reverse_kl_mean=0.5000" in shown and "left=1m 05s" in shown
