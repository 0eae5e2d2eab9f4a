"""A job continued from another's saved state (`student.init_from`), on the local backend:
it starts from that state's weights, with its optimizer only when asked."""

from __future__ import annotations

import pytest
from pytrio.types import ModelInput

from kernel.errors import OPDError
from tests.fakes.sinks import RecordingSink
from tests.support import assert_close
from tests.worker.engine.conftest import TRAINED_STEPS, tiny_spec
from worker.engine.backends import connect
from worker.engine.loop.run import open_run

PROBE = ModelInput.from_ints(list(b"<|im_start|>user\nWhat is 2 + 3?<|im_end|>\nIt is 5."))


async def logprobs_of(service, base_model: str, weights: str | None) -> list[float | None]:
    sampler = await service.create_sampling_client_async(base_model, model_path=weights)
    return (await sampler.compute_logprobs_async(PROBE))[1:]


@pytest.mark.parametrize("with_optimizer", [False, True])
async def test_a_continued_job_starts_from_the_final_state(trained, tmp_path, with_optimizer):
    state = trained.checkpoints[TRAINED_STEPS, "state"]
    spec = tiny_spec(init_from={"path": state, "with_optimizer": with_optimizer})
    service = connect(spec, tmp_path, lambda *_: None)
    sink = RecordingSink()

    run = await open_run(spec, service, sink, None)

    sampler = await run.training.save_weights_and_get_sampling_client_async()
    final = await logprobs_of(service, spec.student.base_model, trained.final)
    assert_close((await sampler.compute_logprobs_async(PROBE))[1:], final, rtol=1e-6)
    assert run.training.inner.steps == (TRAINED_STEPS if with_optimizer else 0)  # Adam's step count
    what = "weights and optimizer" if with_optimizer else "weights"
    assert ("info", f"Started from the {what} of {state}", {"path": state}) in sink.events


async def test_a_job_named_without_a_path_cannot_start_outside_the_service(tmp_path):
    spec = tiny_spec(init_from={"job": 7})
    with pytest.raises(OPDError) as caught:
        await open_run(spec, connect(spec, tmp_path, lambda *_: None), RecordingSink(), None)
    assert caught.value.code == "bad_init_from"
    assert "init_from.path" in str(caught.value)
