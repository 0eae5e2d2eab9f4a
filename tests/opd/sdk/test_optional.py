"""What the SDK does without its optional helpers: no tqdm (a plain progress line on
stderr) and no pandas (a clear ImportError)."""

from __future__ import annotations

import sys

import pytest

from app.jobs.schemas import JobPublic, JobStatus
from opd.sdk import Curves
from opd.sdk.progress import Progress


def test_without_tqdm_progress_is_one_stderr_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` fails
    job = JobPublic.model_construct(id=7, name="j", total_steps=10, steps_done=3)
    bar = Progress(job.model_copy(update={"status": JobStatus.running}))
    bar.show(job.model_copy(update={"status": JobStatus.running}), 0.5)
    bar.show(job.model_copy(update={"status": JobStatus.succeeded, "steps_done": 10}), None)
    bar.close()

    shown = capsys.readouterr().err
    assert bar.bar is None
    assert shown.endswith("\rjob 7 succeeded: 10/10 steps reverse_kl=0.5000\n")
    assert "\rjob 7 running: 3/10 steps reverse_kl=0.5000" in shown


def test_without_pandas_to_pandas_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    curves = Curves.model_validate(
        {
            "job_id": 1,
            "curves": {"opd/reverse_kl_mean": {"steps": [0], "values": [1.0]}},
            "downsampling": {
                "method": "none",
                "first_step": 0,
                "last_step": 0,
                "buckets": None,
                "bucket_steps": None,
            },
        }
    )
    assert curves.points("opd/reverse_kl_mean") == [(0, 1.0)]
    with pytest.raises(ImportError, match="pip install pandas"):
        curves.to_pandas()
