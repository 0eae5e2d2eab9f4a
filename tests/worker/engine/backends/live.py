"""The opt-in live tests' run: one tiny OPD step on a real remote service."""

from __future__ import annotations

from typing import Any

from kernel.spec import JobSpec
from tests.fakes.sinks import REFERENCE_METRICS, RecordingSink
from tests.support import named
from worker.engine.backends.contract import ServiceClient
from worker.engine.data.prompts import Prompts
from worker.engine.loop.state import RunResult
from worker.engine.loop.steps import run_loop


def live_spec(**groups: Any) -> JobSpec:
    """One prompt, one completion of at most 16 tokens, one step; `groups` add the backend
    and the models."""
    return JobSpec.model_validate(
        named(
            {
                "name": "opd-live-test",
                "dataset": {"source": "inline", "prompts": ["What is 1 + 1?"]},
                "sampling": {"max_tokens": 16},
                "loop": {
                    "steps": 1,
                    "batch_size": 1,
                    "group_size": 1,
                    "save_weights_name": "opd-live-test",
                },
            }
            | groups
        )
    )


async def one_tiny_step(spec: JobSpec, service: ServiceClient) -> tuple[RunResult, RecordingSink]:
    """Run `spec` on `service`: a step with the design's metrics, the final state and weights."""
    sink = RecordingSink()
    result = await run_loop(spec, service, Prompts(spec.dataset.prompts, [None]), sink)
    assert sink.steps[0].keys() >= REFERENCE_METRICS
    assert result.final_weights_path
    assert [(step, kind) for step, kind, _ in sink.checkpoints] == [(1, "state"), (1, "final")]
    assert sink.checkpoints[-1][2] == result.final_weights_path
    return result, sink
