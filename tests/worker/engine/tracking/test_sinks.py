"""The JSONL and SwanLab sinks write what the reference scripts log (SwanLab offline)."""

from __future__ import annotations

import json
from pathlib import Path

from app.jobs.weight_paths import written_paths
from kernel.spec import JobSpec
from tests.fakes.sinks import RecordingSink
from worker.engine.tracking.sinks import InTeamWords, JsonlSink, RunInfo, SwanLabSink

SPEC = JobSpec.model_validate(
    {
        "name": "sink-test",
        "backend": "local",
        "student": {"base_model": "tiny-student"},
        "teacher": {"base_model": "tiny-teacher"},
        "dataset": {"source": "inline", "prompts": ["What is 1 + 1?"]},
        "swanlab": {"enabled": True, "mode": "offline", "project": "opd-tests"},
    }
)


def test_jsonl_sink_appends_one_object_per_step(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    for steps in ([0, 1], [2]):  # a resumed run extends the same file
        sink = JsonlSink(path)
        for step in steps:
            sink.step(step, {"opd/reverse_kl_mean": 1.0 / (step + 1)})
        sink.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [
        {"step": 0, "opd/reverse_kl_mean": 1.0},
        {"step": 1, "opd/reverse_kl_mean": 0.5},
        {"step": 2, "opd/reverse_kl_mean": 1.0 / 3},
    ]


def test_swanlab_sink_logs_metrics_config_and_final_weights_offline(tmp_path: Path):
    sink = SwanLabSink(tmp_path / "swanlog")
    sink.start(RunInfo(spec=SPEC, dataset_size=7))
    sink.step(0, {"opd/reverse_kl_mean": 1.25, "data/datums": 4})
    sink.checkpoint(1, "final", "/weights/final")
    sink.close()

    (run,) = (tmp_path / "swanlog").glob("run-*")
    logged = b"".join(path.read_bytes() for path in run.glob("*.swanlab"))
    assert b"opd/reverse_kl_mean" in logged and b"save/weights_path" in logged
    config = (run / "files" / "config.yaml").read_text()
    assert "dataset_size" in config and "sink-test" in config


def test_swanlab_in_the_service_gets_no_worker_folder(tmp_path: Path):
    """A SwanLab project a spec names is the team's to read: the service's sink
    (`team_view`) names weights as the team's key sees them, in the config and the log."""
    dumped = SPEC.model_dump(mode="json")
    dumped["student"]["init_from"] = {"job": 3, "path": "/srv/opd/artifacts/job-3/weights/s"}
    spec = JobSpec.model_validate(dumped)
    sink = SwanLabSink(tmp_path / "swanlog", team_view=True)
    sink.start(RunInfo(spec=spec, dataset_size=7))
    sink.checkpoint(1, "final", "/srv/opd/artifacts/job-7/weights/job-7")
    sink.close()

    (run,) = (tmp_path / "swanlog").glob("run-*")
    written = b"".join(path.read_bytes() for path in run.rglob("*") if path.is_file())
    assert b"/srv/" not in written
    assert b"job-7/weights/job-7" in written and b"job-3/weights/s" in written


def test_in_team_words_gives_trackers_the_spec_and_events_the_paths_as_written():
    """What a relative `teacher.model_path` resolved to is said as the team wrote it: the
    trackers' spec is the stored one, and events name the folder in the team's words."""

    def taught(path: str) -> JobSpec:
        return SPEC.with_teacher("teacher", SPEC.teacher.model_copy(update={"model_path": path}))

    written, loaded = taught("m/t"), taught("/h/d/m/t")
    heard = RecordingSink()
    sink = InTeamWords(heard, written, written_paths(written, loaded))

    sink.start(RunInfo(spec=loaded, dataset_size=1))
    sink.event("info", "loading /h/d/m/t", {"nested": ["/h/d/m/t/adapter"], "n": 1})

    assert heard.info is not None and heard.info.spec.teacher.model_path == "m/t"
    assert heard.events == [("info", "loading m/t", {"nested": ["m/t/adapter"], "n": 1})]
