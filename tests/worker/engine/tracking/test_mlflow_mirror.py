"""What the MLflow mirror sends and when: names MLflow accepts, the spec as params, each step
once no attempt can replay it, a bounded backlog. (Sending itself: tests/e2e/test_mlflow.py,
against a real `mlflow server`.)"""

from __future__ import annotations

import asyncio

import pytest

from kernel.spec import MlflowSpec, parse_spec
from tests.support import named
from worker.engine.tracking.mlflow_mirror import (
    MAX_VALUE_CHARS,
    MlflowSink,
    mlflow_key,
    spec_params,
)
from worker.engine.tracking.sinks import RunInfo

TRACKER = MlflowSpec(tracking_uri="http://127.0.0.1:1")


def queued_steps(sink: MlflowSink) -> list[int]:
    return [chunk[0][3] for chunk in sink.ready]


def test_names_mlflow_refuses_are_spelled_so_it_accepts_them():
    assert mlflow_key("eval/pass@4") == "eval/pass_at_4"
    assert mlflow_key("trainer/loss:sum") == "trainer/loss:sum"
    assert mlflow_key("metadata.owner's team!") == "metadata.owner_s team_"


def test_the_spec_goes_over_flattened_with_long_values_cut():
    spec = parse_spec(
        named(
            {
                "loop": {"steps": 30},
                "dataset": {"source": "inline", "prompts": ["x" * 7000]},
                "metadata": {"owner": "ana"},
            }
        )
    )
    params = spec_params(spec.model_dump(mode="json"))
    assert params["loop.steps"] == "30" and params["loop.kl_discount_factor"] == "0.0"
    assert params["metadata.owner"] == "ana" and params["eval"] == "null"
    assert params["student.base_model"] == spec.student.base_model
    assert len(params["dataset.prompts"]) == MAX_VALUE_CHARS


def test_a_step_is_queued_once_the_state_after_it_is_recorded():
    recorded = []
    sink = MlflowSink(TRACKER, after_recorded=recorded.append)
    for step in range(6):
        sink.step(step, {"opd/reverse_kl_mean": float(step)})
    sink.checkpoint(3, "state", "/states/3")
    assert queued_steps(sink) == [] and sink.tags["opd.checkpoint.state.3"] == "/states/3"
    recorded.pop()()  # the database now holds that state: steps 0..2 can never be replayed
    assert queued_steps(sink) == [0, 1, 2] and sorted(sink.held) == [3, 4, 5]


def test_an_attempt_that_ends_for_good_sends_all_and_one_that_stops_leaves_the_replay():
    done = MlflowSink(TRACKER)
    for step in range(3):
        done.step(step, {"x": 1.0})
    done.eval(3, {"eval/accuracy": 0.5})
    done.finish("succeeded")
    assert queued_steps(done) == [0, 1, 2, 3] and done.status == "FINISHED"

    lost = MlflowSink(TRACKER)
    lost.step(0, {"x": 1.0})
    lost.finish("queued")  # the next attempt replays step 0 and sends it then
    assert queued_steps(lost) == [] and lost.status is None and not lost.held

    for outcome, status in [("failed", "FAILED"), ("cancelled", "KILLED"), ("paused", None)]:
        sink = MlflowSink(TRACKER)
        sink.finish(outcome)
        assert sink.status == status, outcome


def test_the_backlog_is_bounded_the_oldest_steps_going_first():
    sink = MlflowSink(TRACKER, backlog=3)
    for step in range(5):
        sink.step(step, {"x": float(step)})
    # No state saved for longer than the backlog: the oldest held steps are queued early ...
    assert queued_steps(sink) == [0, 1] and sorted(sink.held) == [2, 3, 4]
    sink.finish("succeeded")
    # ... and with the queue full (the tracker away) the oldest queued are dropped, counted.
    assert queued_steps(sink) == [2, 3, 4] and sink.dropped == 2


def test_the_final_weights_are_uploaded_only_when_asked_and_held_as_a_folder(tmp_path):
    asked = MlflowSink(TRACKER.model_copy(update={"log_final_weights": True}))
    asked.checkpoint(4, "state", str(tmp_path))
    asked.checkpoint(4, "final", "trio://remote/weights")  # not a folder the worker holds
    assert asked.pending() == 0
    asked.checkpoint(4, "final", str(tmp_path))
    assert asked.pending() == 1
    uploaded = []

    class Client:
        def log_artifacts(self, run_id: str, path: str, into: str) -> None:
            uploaded.append((run_id, path, into))

    asked.uploads[0](Client(), "run-1")
    assert uploaded == [("run-1", str(tmp_path), "final_weights")]
    not_asked = MlflowSink(TRACKER)
    not_asked.checkpoint(4, "final", str(tmp_path))
    assert not_asked.pending() == 0


WORKER_FOLDER = "/srv/opd/artifacts/job-3/weights/job-3-state-000004"


class Recorder:
    def __init__(self) -> None:
        self.texts: dict[str, str] = {}

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.texts[name] = text


@pytest.mark.parametrize("team_view", [True, False])
async def test_the_service_mirrors_weights_by_the_names_a_team_sees(team_view):
    """The MLflow server a spec names is the team's to read: in the service (`team_view`)
    no worker folder reaches it, in the spec's filled `init_from`, its params or the
    checkpoint tags; `opd run` (no team view) sends the paths as they are."""
    spec = parse_spec(named({"student": {"init_from": {"job": 3, "path": WORKER_FOLDER}}}))
    sink = MlflowSink(TRACKER, team_view=team_view)
    sink.start(RunInfo(spec=spec, dataset_size=4))
    sink.checkpoint(2, "state", "/srv/opd/artifacts/job-7/weights/job-7-state-000002")
    sink.checkpoint(2, "final", "/srv/opd/artifacts/job-7/weights/job-7")
    recorded = Recorder()
    for upload in sink.uploads:
        upload(recorded, "run-1")
    sink.sender.cancel()
    await asyncio.gather(sink.sender, return_exceptions=True)
    sent = [*sink.params.values(), *sink.tags.values(), *recorded.texts.values()]
    if team_view:
        assert not any("/srv/" in value for value in sent), sent
        assert sink.params["student.init_from.path"] == "job-3/weights/job-3-state-000004"
        assert sink.tags["opd.checkpoint.state.2"] == "job-7/weights/job-7-state-000002"
        assert sink.tags["opd.checkpoint.final"] == "job-7/weights/job-7"
    else:
        assert sink.params["student.init_from.path"] == WORKER_FOLDER
        assert sink.tags["opd.checkpoint.final"] == "/srv/opd/artifacts/job-7/weights/job-7"
    assert ("init_from" in recorded.texts["opd/spec.yaml"]) and len(recorded.texts) == 1
