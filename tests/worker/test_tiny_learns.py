"""The offline demo learns: examples/tiny.yaml's student moves toward its teacher."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.spec import load_spec
from worker.backends.local import LocalServiceClient
from worker.engine.loop import run_loop
from worker.engine.sinks import Sink

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"


class ReverseKL(Sink):
    def __init__(self) -> None:
        self.by_step: dict[int, float] = {}

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.by_step[step] = metrics["opd/reverse_kl_mean"]


async def test_tiny_example_cuts_reverse_kl_by_at_least_15_percent(tmp_path):
    spec = load_spec(EXAMPLE)
    assert (spec.backend, spec.student.base_model, spec.teacher.base_model) == (
        "local",
        "tiny-student",
        "tiny-teacher",
    )
    sink = ReverseKL()
    result = await run_loop(
        spec, LocalServiceClient(spec.local, tmp_path), spec.dataset.prompts, sink
    )

    assert result.steps_done == spec.loop.steps == len(sink.by_step)
    curve = [sink.by_step[step] for step in sorted(sink.by_step)]
    first, last = np.mean(curve[:5]), np.mean(curve[-5:])
    assert last <= 0.85 * first, f"reverse KL {first:.3f} -> {last:.3f}"
    assert Path(result.final_weights_path, "adapter_model.safetensors").is_file()
