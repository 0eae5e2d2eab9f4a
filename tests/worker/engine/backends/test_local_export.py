"""Exporting a local checkpoint as a plain Hugging Face model: the LoRA merged into the base
weights loads with transformers where peft cannot be imported, and scores text as the
adapter model does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytrio.types import ModelInput
from transformers import AutoTokenizer

from tests.support import assert_close, score_without_peft
from worker.engine.backends import connect
from worker.engine.backends.local.export import ExportError, merge_adapter
from worker.engine.backends.local.presets import tiny_tokenizer
from worker.engine.data.prompts import build_prompt

TEXT = "<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n<|im_start|>assistant\nIt is 56."


async def test_the_merged_model_loads_without_peft_and_scores_as_the_adapter(trained, tmp_path):
    spec, adapter = trained.spec, Path(trained.final)
    out = tmp_path / "merged"

    merged = merge_adapter(adapter, out)

    assert merged.base_model == "tiny-student" and merged.relative_error <= merged.rtol
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    ids, scores = score_without_peft(out, TEXT)
    service = connect(spec, tmp_path, lambda *_: None)
    with_adapter = await service.create_sampling_client_async("tiny-student", str(adapter))
    expected = await with_adapter.compute_logprobs_async(ModelInput.from_ints(ids))
    assert_close(scores, expected[1:], what="merged (no peft) vs the adapter model")
    base = await service.create_sampling_client_async("tiny-student")
    untrained = await base.compute_logprobs_async(ModelInput.from_ints(ids))
    assert max(abs(a - b) for a, b in zip(scores, untrained[1:], strict=True)) > 1e-3


def test_a_folder_without_an_adapter_is_refused(tmp_path):
    with pytest.raises(ExportError) as caught:
        merge_adapter(tmp_path, tmp_path / "out")
    assert "adapter_config.json" in str(caught.value) and not (tmp_path / "out").exists()


def test_the_merged_models_template_renders_prompts_as_training_did(trained, tmp_path):
    """A job trains with enable_thinking false; the exported template used to render a
    plain apply_chat_template without the empty think block training saw."""
    out = tmp_path / "merged"
    merge_adapter(Path(trained.final), out, enable_thinking=False)
    exported = AutoTokenizer.from_pretrained(out)
    asked = [{"role": "user", "content": "What is 7 * 8?"}]
    plain = exported.apply_chat_template(asked, tokenize=False, add_generation_prompt=True)
    as_trained = build_prompt(tiny_tokenizer(), "What is 7 * 8?", "", enable_thinking=False)
    assert exported.encode(plain, add_special_tokens=False) == as_trained
    thinking = exported.apply_chat_template(
        asked, tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    assert thinking != plain  # a caller may still ask for the other rendering
