"""Which models the local backend loads, and where they run."""

from __future__ import annotations

import asyncio
import threading

import huggingface_hub
import pytest
import torch
from pytrio.errors.base import ValidationError
from pytrio.types import AdamParams, ModelInput, SamplingParams

from kernel.spec import LocalBackendSpec
from tests.support import assert_close
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.models import DeviceUnavailable, ModelNotFound, resolve_placement
from worker.engine.backends.local.presets import tiny_model, tiny_tokenizer
from worker.engine.rollouts.datums import build_opd_datum

PROBE = ModelInput.from_ints(list(b"<|im_start|>user\nWhat is 2 + 3?"))


def test_auto_placement_is_cuda_bf16_with_a_gpu_else_cpu_fp32():
    placement = resolve_placement(LocalBackendSpec())
    if torch.cuda.is_available():
        assert (placement.device.type, placement.dtype) == ("cuda", torch.bfloat16)
    else:
        assert (placement.device.type, placement.dtype) == ("cpu", torch.float32)
    explicit = resolve_placement(LocalBackendSpec(device="cpu", dtype="bfloat16"))
    assert (explicit.device.type, explicit.dtype) == ("cpu", torch.bfloat16)


def test_asking_for_cuda_without_a_gpu_says_what_to_do(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailable, match=r"set local\.device to 'auto' or 'cpu'"):
        resolve_placement(LocalBackendSpec(device="cuda"))


async def test_a_hugging_face_folder_loads_like_the_preset(tmp_path):
    tiny_model("tiny-teacher").save_pretrained(tmp_path / "teacher")
    tiny_tokenizer().save_pretrained(tmp_path / "teacher")
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path / "artifacts")
    from_folder = await service.create_sampling_client_async(str(tmp_path / "teacher"))
    preset = await service.create_sampling_client_async("tiny-teacher")
    assert from_folder.get_tokenizer().get_vocab() == preset.get_tokenizer().get_vocab()
    scored = await from_folder.compute_logprobs_async(PROBE)
    expected = await preset.compute_logprobs_async(PROBE)
    assert scored[0] is expected[0] is None
    assert_close(scored[1:], expected[1:])
    trainer = await service.create_lora_training_client_async(str(tmp_path / "teacher"), 4, 0)
    assert trainer.trainable and all(p.dtype == torch.float32 for p in trainer.trainable.values())


async def test_a_hub_id_loads_from_the_hub_cache_never_from_a_folder_of_that_name(
    tmp_path, monkeypatch
):
    """`org/tiny` in the hub cache is the teacher; a folder `org/tiny` in the working
    directory holds the student, and is not what loads."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--tiny" / "snapshots" / "abc123"
    for model, folder in (("tiny-teacher", snapshot), ("tiny-student", tmp_path / "org/tiny")):
        tiny_model(model).save_pretrained(folder)
        tiny_tokenizer().save_pretrained(folder)
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path / "artifacts")
    cached = await service.create_sampling_client_async("org/tiny")
    expected = await service.create_sampling_client_async("tiny-teacher")
    assert_close(
        (await cached.compute_logprobs_async(PROBE))[1:],
        (await expected.compute_logprobs_async(PROBE))[1:],
    )


async def test_an_unknown_model_names_what_to_pass(tmp_path):
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    with pytest.raises(ModelNotFound, match="tiny-student, tiny-teacher") as error:
        await service.create_sampling_client_async("no-such/model-xyz")
    assert error.value.code == "model_not_found"
    with pytest.raises(ModelNotFound, match="Hugging Face model folder"):
        await service.create_lora_training_client_async(str(tmp_path), rank=8)
    with pytest.raises(ValidationError, match=r"rank must be in \[4, 64\]"):
        await service.create_lora_training_client_async("tiny-student", rank=2)


async def test_bf16_base_keeps_lora_and_optimizer_in_fp32(tmp_path):
    service = LocalServiceClient(LocalBackendSpec(device="cpu", dtype="bfloat16"), tmp_path)
    trainer = await service.create_lora_training_client_async("tiny-student", rank=4, seed=0)
    frozen = {p.dtype for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16}
    sampler = await trainer.save_weights_and_get_sampling_client_async()
    drawn = await sampler.sample_async(PROBE, 1, SamplingParams(max_tokens=4, seed=0))
    seq = drawn.sequences[0]
    datum = build_opd_datum(PROBE.to_ints(), seq.tokens, seq.logprobs, [1.0] * len(seq.tokens))
    await (await trainer.forward_backward_async([datum], "importance_sampling"))
    await (await trainer.optim_step_async(AdamParams(learning_rate=1e-2)))
    moments = [
        t for state in trainer.optimizer.state.values() for k, t in state.items() if k != "step"
    ]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    assert {p.dtype for p in trainer.trainable.values()} == {torch.float32}


async def test_a_conversions_notes_reach_the_event_loops_thread_from_the_runners(tmp_path):
    """A model loads on the runner's thread; what it notes (a GGUF being converted) becomes
    an event of the run, and sinks are not thread-safe: the note is called on the loop."""
    heard: list[tuple[str, threading.Thread]] = []
    service = LocalServiceClient(
        LocalBackendSpec(device="cpu"),
        tmp_path / "artifacts",
        model_cache=tmp_path / "cache",
        note=lambda message, data: heard.append((message, threading.current_thread())),
    )
    models = service.models()

    await service.runner.submit(models.note, "Converting model.gguf", {})
    await asyncio.sleep(0)

    assert models.folder == tmp_path / "cache"
    assert heard == [("Converting model.gguf", threading.current_thread())]
