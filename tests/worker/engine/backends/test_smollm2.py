"""smollm2-135m-instruct, the real model the `smollm2` extra installs: its GGUF converted once
into a plain Hugging Face folder (shared by the whole test run), loaded by the local backend
like any model, and an operator's copy of the file used as base_model without a second
conversion. The preflight tells its tokenizer from the byte-level presets'."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pytrio.types import ModelInput, SamplingParams

from kernel.model_names import SMOLLM2
from kernel.spec import LocalBackendSpec, PromptOptions
from tests.support import converted_smollm2
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.models import ModelCache, load_tokenizer, located
from worker.engine.backends.local.packaged import packaged_file
from worker.engine.backends.local.presets import preset_tokenizer
from worker.engine.data.prompts import build_prompt
from worker.engine.teachers.preflight import teacher_mode

QUESTION = "7 + 8 = ?"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return converted_smollm2(tmp_path_factory)


def test_the_preset_converts_into_a_plain_folder_that_says_nothing_of_gguf(cache):
    folder = Path(located(SMOLLM2, ModelCache(cache)))

    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["vocab_size"]) == (30, 49152)
    assert (folder / "model.safetensors").stat().st_size > 4 * 100e6, "float32 weights"
    assert folder.name.startswith("gguf-") and not list(cache.glob(".gguf-*.tmp-*"))


async def test_the_local_backend_loads_it_and_it_answers_as_smollm2_does(cache, tmp_path):
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path, model_cache=cache)
    sampler = await service.create_sampling_client_async(SMOLLM2)
    tokenizer = sampler.get_tokenizer()
    prompt = build_prompt(tokenizer, QUESTION, "", enable_thinking=False)

    assert len(tokenizer) == 49152 and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.decode(prompt).startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>")
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    answer = await sampler.sample_async(ModelInput.from_ints(prompt), 1, greedy)
    # What transformers answers reading the GGUF itself (greedy), measured by hand.
    assert tokenizer.decode(answer.sequences[0].tokens) == "The answer is 15.<|im_end|>"
    scored = await sampler.compute_logprobs_async(ModelInput.from_ints(prompt))
    assert scored[0] is None and all(-30 < value <= 0 for value in scored[1:])


async def test_an_operators_copy_of_the_file_uses_the_same_converted_folder(cache, tmp_path):
    copy = tmp_path / "data" / "models" / "smollm2.Q4_1.gguf"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(packaged_file(SMOLLM2), copy)
    notes: list[str] = []

    folder = located(str(copy), ModelCache(cache, lambda message, data: notes.append(message)))

    assert folder == located(SMOLLM2, ModelCache(cache)) and notes == [], "no second conversion"
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path, model_cache=cache)
    trainer = await service.create_lora_training_client_async(str(copy), rank=4, seed=0)
    assert (
        trainer.get_tokenizer().get_vocab()
        == load_tokenizer(SMOLLM2, ModelCache(cache)).get_vocab()
    )


def test_the_preflight_reads_it_as_another_tokenizer_than_the_byte_level_presets(cache):
    smollm2 = load_tokenizer(SMOLLM2, ModelCache(cache))
    prompts = [(QUESTION, PromptOptions())]

    assert teacher_mode(smollm2, smollm2, prompts) == "same"
    assert teacher_mode(smollm2, preset_tokenizer("tiny-teacher"), prompts) == "cross"
    assert teacher_mode(preset_tokenizer("arith-student"), smollm2, prompts) == "cross"
