"""A request is refused alike on the local engine and on vLLM, before any work: PyTRIO's
checks and the same stop tokens (a multi-token stop string is refused, not dropped)."""

from __future__ import annotations

import pytest
from pytrio.errors.base import ValidationError
from pytrio.types import ModelInput, SamplingParams

from kernel.retry import Backoff
from tests.e2e.servers import free_port
from tests.worker.engine.backends.test_local_sampling import PROMPTS, TOKENIZER
from worker.engine.backends.vllm import VLLMSampler, VLLMServer

PROMPT = ModelInput.from_ints(PROMPTS[0])
REFUSED = [
    ("max_tokens", PROMPT, 1, SamplingParams(), 0),
    ("prompt cannot be empty", ModelInput.from_ints([]), 1, SamplingParams(max_tokens=4), 0),
    ("num_samples", PROMPT, 0, SamplingParams(max_tokens=4), 0),
    ("temperature", PROMPT, 1, SamplingParams(max_tokens=4, temperature=-1.0), 0),
    ("top_p", PROMPT, 1, SamplingParams(max_tokens=4, top_p=0.0), 0),
    ("top_k", PROMPT, 1, SamplingParams(max_tokens=4, top_k=0), 0),
    ("topk_prompt_logprobs", PROMPT, 1, SamplingParams(max_tokens=4), -1),
    ("is 2 tokens", PROMPT, 1, SamplingParams(max_tokens=4, stop=["ab"]), 0),
]


@pytest.fixture(params=["local", "vllm"])
async def sampler(request, tmp_path):
    if request.param == "local":
        from kernel.spec import LocalBackendSpec
        from worker.engine.backends.local import LocalServiceClient

        service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
        trainer = await service.create_lora_training_client_async("tiny-student", rank=4)
        return await trainer.save_weights_and_get_sampling_client_async()
    # Nothing listens there: a request that got past the checks would fail as the server away.
    server = VLLMServer(
        f"http://127.0.0.1:{free_port()}/v1", "tiny-student", backoff=Backoff(attempts=1)
    )
    return VLLMSampler(server, "opd-test-v0", TOKENIZER)


@pytest.mark.parametrize(("message", "prompt", "n", "params", "topk"), REFUSED)
async def test_each_engine_refuses_a_request_alike(sampler, message, prompt, n, params, topk):
    with pytest.raises(ValidationError, match=message) as refused:
        await sampler.sample_async(prompt, n, params, topk_prompt_logprobs=topk)
    assert refused.value.code in ("validation.invalid_sampling_request", "validation.empty_prompt")


async def test_an_empty_prompt_is_not_scored_on_either_engine(sampler):
    with pytest.raises(ValidationError, match="prompt cannot be empty"):
        await sampler.compute_logprobs_async(ModelInput.from_ints([]))
