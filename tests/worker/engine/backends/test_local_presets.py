"""The built-in tiny models and byte-level tokenizer."""

from __future__ import annotations

import asyncio

import torch
from transformers import AutoTokenizer

from kernel.model_names import BYTE_LEVEL_TEMPLATE_TOKENS
from kernel.spec import LocalBackendSpec, PromptOptions
from worker.engine.backends.local import LocalServiceClient
from worker.engine.backends.local.presets import tiny_model, tiny_tokenizer
from worker.engine.data.prompts import build_prompt
from worker.engine.teachers.preflight import teacher_mode, tokenizer_difference

TEXT = "Solve 2x + 3 = 7 — café ✓\n"


def test_every_utf8_byte_is_one_token():
    tokenizer = tiny_tokenizer()
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert ids == list(TEXT.encode())
    assert tokenizer.decode(ids) == TEXT
    assert len(tokenizer) == 259


def test_special_tokens_and_chat_template():
    tokenizer = tiny_tokenizer()
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 256)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 258)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 257
    messages = [{"role": "user", "content": "hi"}]
    plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    no_think = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert no_think == plain + "<think>\n\n</think>\n\n"
    ids = build_prompt(tokenizer, "hi", "", False)
    assert ids[0] == 257 and ids.count(258) == 1
    assert tokenizer.decode(ids) == no_think


def test_the_tokenizer_survives_save_pretrained(tmp_path):
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer_difference(tokenizer, reloaded) is None
    assert teacher_mode(tokenizer, reloaded, [("hi", PromptOptions())]) == "same"
    assert reloaded.encode(TEXT, add_special_tokens=False) == list(TEXT.encode())
    assert reloaded.eos_token == "<|im_end|>"
    assert reloaded.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    ).endswith("<think>\n\n</think>\n\n")


def test_presets_are_fixed_and_the_teacher_is_far_from_the_student():
    prompt = torch.tensor([build_prompt(tiny_tokenizer(), "What is 2 + 3?", "", False)])
    with torch.no_grad():
        student = tiny_model("tiny-student")(prompt).logits.log_softmax(-1)
        again = tiny_model("tiny-student")(prompt).logits.log_softmax(-1)
        teacher = tiny_model("tiny-teacher")(prompt).logits.log_softmax(-1)
    assert torch.equal(student, again)
    reverse_kl = (student.exp() * (student - teacher)).sum(-1).mean()
    assert reverse_kl > 0.5
    uniform = torch.log(torch.tensor(259.0))
    entropy = -(student.exp() * student).sum(-1).mean()
    assert entropy < uniform - 0.5, "the student must not be near-uniform"


def test_the_byte_level_presets_template_adds_the_tokens_estimates_count() -> None:
    """kernel/model_names.py's BYTE_LEVEL_TEMPLATE_TOKENS, which a cold estimate uses, is
    what the presets' tokenizer makes of a question: a token a byte plus the template's."""
    for question, suffix in (("x", ""), ("What is 7 * 8?", "Answer in \\boxed{}.")):
        content = f"{question}\n\n{suffix}" if suffix else question
        prompt = build_prompt(tiny_tokenizer(), question, suffix, enable_thinking=False)
        assert len(prompt) == len(content.encode()) + BYTE_LEVEL_TEMPLATE_TOKENS


async def test_models_loaded_on_several_threads_at_once_are_the_presets(tmp_path):
    """A worker's playground loads saved weights (a LoRA read into a fresh adapter, whose
    init draws from torch's process-wide generator) on its backend's thread while jobs
    load the presets on theirs: every model loaded is still exactly the preset, or the
    preset with those weights (a teacher server naming `job-N` once answered as another
    model: reverse KL 2.2 where the job's weights give 0.002)."""
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path / "a")
    training = await service.create_lora_training_client_async("tiny-student", rank=8, seed=3)
    path = (await (await training.save_weights_for_sampler_async("w"))).path
    reference = {
        None: parameters((await service.create_sampling_client_async("tiny-student")).model),
        path: parameters((await service.create_sampling_client_async("tiny-student", path)).model),
    }
    services = [
        LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path / str(i)) for i in range(4)
    ]
    loads = [(one, weights) for _ in range(6) for one in services for weights in reference]
    loaded = await asyncio.gather(
        *(one.create_sampling_client_async("tiny-student", weights) for one, weights in loads)
    )
    differ = [
        weights
        for (_, weights), client in zip(loads, loaded, strict=True)
        if not all(map(torch.equal, parameters(client.model), reference[weights]))
    ]
    assert not differ, f"{len(differ)} of {len(loads)} models loaded at once are not the preset"


def parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [tensor.detach().clone() for tensor in model.state_dict().values()]
