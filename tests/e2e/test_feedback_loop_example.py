"""examples/feedback-loop.py is run by hand (SmolLM2 served, 60 chats, a distillation job:
its figures are in docs/how-to/feedback-loop.md); here, that the two jobs it submits stay
specs the service takes, each with the alias its client sends."""

from __future__ import annotations

import re
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType

from kernel.chats.conversation import Conversation
from kernel.spec import JobSpec
from worker.engine.teachers.views import FEEDBACK_LINE, in_context

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "feedback-loop.py"
BARE_NUMBER = re.compile(r"-?[0-9]+")


def loaded() -> ModuleType:
    """The example as a module (its name has a dash)."""
    found = spec_from_file_location("feedback_loop", EXAMPLE)
    assert found is not None and found.loader is not None
    example = module_from_spec(found)
    found.loader.exec_module(example)
    return example


def test_the_feedback_loop_examples_jobs_are_specs_the_service_takes() -> None:
    example = loaded()
    served = JobSpec.model_validate(example.served_job("file-1"))
    distil = JobSpec.model_validate(example.distil_job("file-1", 10))
    assert served.alias == distil.alias == example.ALIAS
    ((_, stored),) = distil.stored_datasets()
    assert stored.filter.has_feedback and distil.loop.steps == 10


def test_the_feedback_teachers_example_turns_read_as_a_stored_question_does() -> None:
    """Its example turns show the teacher a question in the shape the engine gives it a
    stored one (the feedback line after it), the shape that made the base follow the
    correction (docs/how-to/feedback-loop.md)."""
    example = loaded()
    distil = JobSpec.model_validate(example.distil_job("file-1", 10))
    context = distil.teachers["corrected"].self
    assert context is not None and len(context.examples) == 3
    asked = Conversation.model_validate(
        {"messages": [{"role": "user", "content": "What is 1 + 1?"}]}
    )
    read = in_context(asked, context, None, example.CORRECTION).messages
    stored_shape = read[-1].text().removeprefix("What is 1 + 1?")
    assert stored_shape == f"\n\n{FEEDBACK_LINE}{example.CORRECTION}"
    for turn in context.examples:
        assert turn.user.endswith(stored_shape) and BARE_NUMBER.fullmatch(turn.assistant)
