"""examples/feedback-loop.py is run by hand (SmolLM2 served, 60 chats, a distillation job:
its figures are in docs/how-to/feedback-loop.md); here, that the two jobs it submits stay
specs the service takes, each with the alias its client sends."""

from __future__ import annotations

from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

from kernel.spec import JobSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "feedback-loop.py"


def test_the_feedback_loop_examples_jobs_are_specs_the_service_takes() -> None:
    found = spec_from_file_location("feedback_loop", EXAMPLE)
    assert found is not None and found.loader is not None
    example = module_from_spec(found)
    found.loader.exec_module(example)
    served = JobSpec.model_validate(example.served_job("file-1"))
    distil = JobSpec.model_validate(example.distil_job("file-1", 10))
    assert served.alias == distil.alias == example.ALIAS
    ((_, stored),) = distil.stored_datasets()
    assert stored.filter.has_feedback and distil.loop.steps == 10
