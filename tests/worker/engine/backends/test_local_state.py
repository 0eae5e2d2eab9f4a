"""Saving and restoring the local backend: a resumed run is the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pytrio.errors.base import ValidationError
from pytrio.types import AdamParams, ModelInput
from safetensors.torch import load_file

from kernel.spec import JobSpec, LocalBackendSpec
from tests.support import assert_close
from tests.worker.engine.reference import reference_run
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.checkpoints import CheckpointError
from worker.engine.data.prompts import Prompts
from worker.engine.loop.state import RunResult, SavedState, Stop
from worker.engine.loop.steps import run_loop
from worker.engine.tracking.sinks import Sink

PROMPTS = ["What is 2 + 3?", "Compute 7 * 8.", "Is 9 prime?"]


class Recorder(Sink):
    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.checkpoints: dict[tuple[int, str], str] = {}
        self.result: RunResult | None = None

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.metrics[step] = metrics

    def checkpoint(self, step: int, kind: str, path: str) -> None:
        self.checkpoints[step, kind] = path


def spec() -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "resume",
            "backend": "local",
            "student": {"base_model": "tiny-student", "lora_rank": 8, "seed": 11},
            "teacher": {"base_model": "tiny-teacher"},
            "dataset": {"source": "inline", "prompts": PROMPTS, "question_suffix": ""},
            "sampling": {"max_tokens": 8},
            "optim": {"learning_rate": 1e-3, "weight_decay": 0.01, "grad_clip_norm": 1.0},
            "loop": {
                "steps": 6,
                "batch_size": 2,
                "group_size": 2,
                "save_every": 2,
                "save_weights_name": "resume",
            },
        }
    )


def pipelined(**loop: Any) -> JobSpec:
    """spec() with other loop settings (max_steps_off_policy, steps, save_every, objective)."""
    fields = spec().model_dump()
    fields["loop"] |= loop
    return JobSpec.model_validate(fields)


async def run(
    artifact_dir: Path,
    resume: SavedState | None = None,
    *,
    job: JobSpec | None = None,
    stop_after: int | None = None,
    stop: Stop = Stop.resume,
) -> Recorder:
    """Run `job` (spec() by default); with `stop_after` n steps, `stop` is asked for."""
    recorder = Recorder()
    job = job or spec()
    service = LocalServiceClient(job.local, artifact_dir)
    recorder.result = await run_loop(
        job,
        service,
        Prompts(PROMPTS, [None] * len(PROMPTS)),
        recorder,
        resume=resume,
        should_stop=lambda: (
            stop if stop_after is not None and len(recorder.metrics) >= stop_after else None
        ),
    )
    return recorder


def saved_tensors(folder: str) -> dict[str, torch.Tensor]:
    tensors = dict(load_file(Path(folder) / "adapter_model.safetensors"))
    optimizer = torch.load(Path(folder) / "optimizer.pt", weights_only=True)
    for index, state in optimizer["state"].items():
        tensors.update({f"optimizer.{index}.{key}": value for key, value in state.items()})
    return tensors


async def test_a_resumed_run_reproduces_the_uninterrupted_run(tmp_path):
    whole = await run(tmp_path / "whole")
    resumed = await run(tmp_path / "resumed", SavedState(whole.checkpoints[2, "state"], 2))

    assert sorted(resumed.metrics) == [2, 3, 4, 5]
    for step in (2, 3, 4, 5):
        for key in ("opd/reverse_kl_mean", "trainer/loss_sum", "data/completion_tokens_total"):
            assert resumed.metrics[step][key] == whole.metrics[step][key], (step, key)
    expected = saved_tensors(whole.checkpoints[4, "state"])
    actual = saved_tensors(resumed.checkpoints[4, "state"])
    assert expected.keys() == actual.keys() and len(expected) > 10
    for name, tensor in expected.items():
        assert torch.equal(tensor, actual[name]), name
    final = [
        load_file(Path(r.checkpoints[6, "final"]) / "adapter_model.safetensors")
        for r in (whole, resumed)
    ]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])


def final_adapter(folder: str) -> dict[str, torch.Tensor]:
    return load_file(Path(folder) / "adapter_model.safetensors")


def assert_same_training(resumed: Recorder, whole: Recorder, steps: int) -> None:
    """The resumed run's steps are the uninterrupted run's, to the bit, and so are its
    final weights."""
    for step in resumed.metrics:
        for key in ("opd/reverse_kl_mean", "trainer/loss_sum", "data/completion_tokens_total"):
            assert resumed.metrics[step][key] == whole.metrics[step][key], (step, key)
    expected = final_adapter(whole.checkpoints[steps, "final"])
    actual = final_adapter(resumed.checkpoints[steps, "final"])
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


async def test_on_policy_trains_exactly_as_the_reference_loop(tmp_path):
    whole = await run(tmp_path / "loop")
    service = LocalServiceClient(spec().local, tmp_path / "reference")
    training, _ = await reference_run(spec(), service, PROMPTS)
    reference = await (await training.save_weights_for_sampler_async("reference"))

    expected, actual = final_adapter(reference.path), final_adapter(whole.checkpoints[6, "final"])
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


async def test_one_step_off_policy_resumes_exactly_after_a_stop_and_after_a_crash(tmp_path):
    job = pipelined(max_steps_off_policy=1, steps=7, save_every=3)
    whole = await run(tmp_path / "whole", job=job)
    assert [whole.metrics[s]["train/staleness_max"] for s in range(7)] == [0, 1, 1, 1, 1, 1, 1]

    # Asked at step 1, whose resume needs the initial weights (not kept for a save): the
    # stop takes effect a step later, with the weights of step 1 kept.
    stopped = await run(tmp_path / "stopped", job=job, stop_after=1)
    assert stopped.result is not None and stopped.result.state is not None
    assert (stopped.result.steps_done, set(stopped.result.state.samplers)) == (2, {1})
    after_stop = await run(tmp_path / "stopped", stopped.result.state, job=job)
    assert sorted(after_stop.metrics) == [2, 3, 4, 5, 6]
    assert_same_training(after_stop, whole, 7)

    kept = {step: path for (step, kind), path in whole.checkpoints.items() if kind == "sampler"}
    crash_state = SavedState(whole.checkpoints[6, "state"], 6, kept)
    after_crash = await run(tmp_path / "whole", crash_state, job=job)
    assert sorted(after_crash.metrics) == [6]
    assert_same_training(after_crash, whole, 7)


async def test_a_logit_level_objective_resumes_exactly_two_steps_off_policy(tmp_path):
    objective = {"kind": "jsd", "top_k": 16}
    job = pipelined(max_steps_off_policy=2, steps=6, save_every=3, objective=objective)
    whole = await run(tmp_path / "whole", job=job)
    assert all(0 < whole.metrics[s]["opd/teacher_mass_mean"] <= 1 for s in range(6))

    kept = {step: path for (step, kind), path in whole.checkpoints.items() if kind == "sampler"}
    resumed = await run(
        tmp_path / "whole", SavedState(whole.checkpoints[3, "state"], 3, kept), job=job
    )
    assert sorted(resumed.metrics) == [3, 4, 5]
    for step in resumed.metrics:
        assert (
            resumed.metrics[step]["opd/objective_mean"] == whole.metrics[step]["opd/objective_mean"]
        )
    assert_same_training(resumed, whole, 6)


async def test_the_sampled_reverse_kl_means_the_same_whichever_objective_trains(tmp_path):
    """A logit-level objective's trainer scores the sampled tokens with the teacher (the
    rollouts do not); step 0 samples the same completions under every objective, so its
    sampled reverse KL is the reference's."""
    reference = await run(tmp_path / "reference", job=pipelined(steps=1, save_every=0))
    logit = await run(
        tmp_path / "jsd", job=pipelined(steps=1, save_every=0, objective="reverse_kl")
    )
    for key in ("opd/reverse_kl_mean", "opd/reverse_kl_std", "data/completion_tokens_total"):
        assert_close(logit.metrics[0][key], reference.metrics[0][key], rtol=1e-5, what=key)


async def test_one_step_off_policy_cancels_at_the_next_boundary_without_sampler_weights(tmp_path):
    """A resumable stop asked at step 1 would train step 1 and keep its weights; a cancel
    ends the run right there with its state, and one asked during the last step leaves no
    final weights."""
    job = pipelined(max_steps_off_policy=1, steps=4, save_every=0)
    early = await run(tmp_path / "early", job=job, stop_after=1, stop=Stop.cancel)
    last = await run(tmp_path / "last", job=job, stop_after=4, stop=Stop.cancel)

    for recorder, steps in ((early, 1), (last, 4)):
        state = recorder.checkpoints[steps, "state"]
        assert recorder.result == RunResult(steps, stopped=True, state=SavedState(state, steps))
        assert sorted(recorder.metrics) == list(range(steps))
        assert list(recorder.checkpoints) == [(steps, "state")]
    assert not [*tmp_path.glob("*/sampler")], "no sampler or final weights"


async def test_checkpoints_are_self_describing_folders(tmp_path):
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    trainer = await service.create_lora_training_client_async("tiny-student", rank=4, seed=1)
    await (await trainer.optim_step_async(AdamParams()))
    state = await (await trainer.save_state_async("s"))
    sampler = await (await trainer.save_weights_for_sampler_async("w"))

    assert state.path == str(tmp_path.resolve() / "state" / "s")
    assert sampler.path == str(tmp_path.resolve() / "sampler" / "w")
    assert (state.model, sampler.model) == ("tiny-student", "tiny-student")
    assert state.size == sum(p.stat().st_size for p in Path(state.path).iterdir())
    manifest = json.loads((Path(sampler.path) / "manifest.json").read_text())
    assert manifest == {"kind": "sampler", "base_model": "tiny-student", "lora_rank": 4, "step": 1}
    assert (Path(sampler.path) / "tokenizer.json").is_file()
    assert (Path(state.path) / "optimizer.pt").is_file()
    assert not [p for p in (tmp_path / "state").iterdir() if p.name.startswith(".")]


async def test_saving_again_replaces_the_folder(tmp_path):
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    trainer = await service.create_lora_training_client_async("tiny-student", rank=4, seed=1)
    first = await (await trainer.save_weights_for_sampler_async("w"))
    await (await trainer.optim_step_async(AdamParams()))
    second = await (await trainer.save_weights_for_sampler_async("w"))
    assert first.path == second.path
    manifest = json.loads((Path(second.path) / "manifest.json").read_text())
    assert manifest["step"] == 1
    assert sorted(p.name for p in (tmp_path / "sampler").iterdir()) == ["w"]


async def test_a_teacher_loads_saved_sampler_weights(tmp_path):
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    trainer = await service.create_lora_training_client_async("tiny-student", rank=4, seed=1)
    for param in trainer.trainable.values():
        param.data.normal_(std=0.05)
    saved = await (await trainer.save_weights_for_sampler_async("w"))
    live = await trainer.save_weights_and_get_sampling_client_async()
    loaded = await service.create_sampling_client_async("tiny-student", model_path=saved.path)
    base = await service.create_sampling_client_async("tiny-student")

    probe = ModelInput.from_ints(list(b"<|im_start|>user\nhello"))
    expected = await live.compute_logprobs_async(probe)
    assert_close((await loaded.compute_logprobs_async(probe))[1:], expected[1:])
    assert await base.compute_logprobs_async(probe) != pytest.approx(expected, abs=1e-3)
    with pytest.raises(CheckpointError, match="holds LoRA weights for 'tiny-student'"):
        await service.create_sampling_client_async("tiny-teacher", model_path=saved.path)
    (Path(saved.path) / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="cannot load LoRA weights"):
        await service.create_sampling_client_async("tiny-student", model_path=saved.path)


async def test_bad_restores_fail_clearly(tmp_path):
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    trainer = await service.create_lora_training_client_async("tiny-student", rank=4, seed=1)
    saved = await (await trainer.save_state_async("s"))

    fresh = await service.create_lora_training_client_async("tiny-student", rank=4, seed=1)
    with pytest.raises(CheckpointError, match="no state checkpoint"):
        await (await fresh.load_state_with_optimizer_async(str(tmp_path / "missing")))

    other_rank = await service.create_lora_training_client_async("tiny-student", rank=8, seed=1)
    with pytest.raises(CheckpointError, match="LoRA rank 4"):
        await (await other_rank.load_state_with_optimizer_async(saved.path))

    (Path(saved.path) / "adapter_model.safetensors").write_bytes(b"not safetensors")
    corrupt = await service.create_lora_training_client_async("tiny-student", rank=4, seed=1)
    with pytest.raises(CheckpointError, match="cannot restore state"):
        await (await corrupt.load_state_with_optimizer_async(saved.path))

    with pytest.raises(ValidationError, match="before the first training operation"):
        await trainer.load_state_with_optimizer_async(saved.path)
    with pytest.raises(CheckpointError, match="is not valid"):
        await trainer.save_state_async("../escape")
