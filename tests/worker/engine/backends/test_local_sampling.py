"""The local sampler: batching-independent seeds, truncation, stops, raw logprobs, snapshots."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from pytrio.errors.base import ValidationError
from pytrio.types import AdamParams, ModelInput, SampleResponse, SamplingParams

from kernel.spec import LocalBackendSpec
from tests.support import assert_close
from worker.engine.backends.local import LocalServiceClient, LocalTrainingClient, decoding
from worker.engine.backends.local.presets import tiny_tokenizer
from worker.engine.backends.local.sampler import LocalSamplingClient
from worker.engine.backends.sampling_request import stop_token_ids
from worker.engine.data.prompts import build_prompt
from worker.engine.rollouts.datums import build_opd_datum

TOKENIZER = tiny_tokenizer()
PROMPTS = [build_prompt(TOKENIZER, q, "", False) for q in ("What is 2+3?", "Name a prime.", "x")]


@pytest.fixture
async def trainer(tmp_path) -> LocalTrainingClient:
    service = LocalServiceClient(LocalBackendSpec(device="cpu"), tmp_path)
    return await service.create_lora_training_client_async("tiny-student", rank=8, seed=5)


@pytest.fixture
async def sampler(trainer) -> LocalSamplingClient:
    return await trainer.save_weights_and_get_sampling_client_async()


def params(**overrides) -> SamplingParams:
    return SamplingParams(**({"max_tokens": 12, "seed": 7} | overrides))


async def sample(client: LocalSamplingClient, prompt: list[int], n: int = 3, **overrides):
    return await client.sample_async(
        ModelInput.from_ints(prompt), n, params(**overrides), return_text=False
    )


def outputs(response: SampleResponse) -> list[tuple[list[int], list[float], str]]:
    return [(s.tokens, s.logprobs, s.stop_reason) for s in response.sequences]


def assert_same(a: SampleResponse, b: SampleResponse) -> None:
    for (tokens_a, lps_a, stop_a), (tokens_b, lps_b, stop_b) in zip(
        outputs(a), outputs(b), strict=True
    ):
        assert (tokens_a, stop_a) == (tokens_b, stop_b)
        assert_close(lps_a, lps_b)


async def test_a_request_samples_the_same_whatever_shares_its_batch(trainer):
    alone = await trainer.save_weights_and_get_sampling_client_async()
    first = await sample(alone, PROMPTS[0])
    crowded = await trainer.save_weights_and_get_sampling_client_async()
    crowd = await asyncio.gather(
        sample(crowded, PROMPTS[0]),
        sample(crowded, PROMPTS[1], n=5, max_tokens=30, temperature=0.5),
        sample(crowded, PROMPTS[2], n=2, max_tokens=3),
    )
    reordered = await trainer.save_weights_and_get_sampling_client_async()
    other_order = await asyncio.gather(
        sample(reordered, PROMPTS[0]),
        sample(reordered, PROMPTS[2], n=2, max_tokens=3),
        sample(reordered, PROMPTS[1], n=5, max_tokens=30, temperature=0.5),
    )
    assert_same(first, crowd[0])
    assert_same(first, other_order[0])
    assert len({tuple(tokens) for tokens, _, _ in outputs(first)}) > 1, "rows must differ"


async def test_concurrent_requests_share_one_batched_generation(sampler, monkeypatch):
    batches: list[int] = []
    generate = decoding.generate

    def counting(forward, config, requests, *args):
        batches.append(len(requests))
        return generate(forward, config, requests, *args)

    monkeypatch.setattr("worker.engine.backends.local.sampler.generate", counting)
    await asyncio.gather(*(sample(sampler, p) for p in PROMPTS))
    assert batches == [3]


async def test_the_seed_and_the_request_order_choose_the_draws(trainer):
    first = await trainer.save_weights_and_get_sampling_client_async()
    second = await trainer.save_weights_and_get_sampling_client_async()
    a = await sample(first, PROMPTS[0])
    b = await sample(second, PROMPTS[0], seed=8)
    c = await sample(first, PROMPTS[0])
    assert outputs(a) != outputs(b)
    assert outputs(a) != outputs(c), "the second request of a sampler draws afresh"


async def test_top_k_one_is_greedy_argmax(sampler):
    response = await sample(sampler, PROMPTS[0], n=2, top_k=1, max_tokens=10, temperature=1.3)
    tokens = list(PROMPTS[0])
    with torch.no_grad():
        for _ in range(10):
            logits = sampler.model(input_ids=torch.tensor([tokens])).logits[0, -1]
            tokens.append(int(logits.argmax()))
    greedy = tokens[len(PROMPTS[0]) :]
    assert [s.tokens for s in response.sequences] == [greedy, greedy]


async def test_max_tokens_and_stop_tokens_end_generation(sampler):
    greedy = (await sample(sampler, PROMPTS[0], n=1, top_k=1, max_tokens=10)).sequences[0]
    assert (len(greedy.tokens), greedy.stop_reason) == (10, "length")
    stop = greedy.tokens[3]
    stopped = (await sample(sampler, PROMPTS[0], n=1, top_k=1, stop=[stop])).sequences[0]
    end = greedy.tokens.index(stop) + 1
    assert (stopped.tokens, stopped.stop_reason) == (greedy.tokens[:end], "stop")
    assert_close(stopped.logprobs, greedy.logprobs[:end])


def test_stop_strings_must_be_single_tokens():
    assert stop_token_ids(TOKENIZER, ["<|im_end|>", "<|endoftext|>"]) == {258, 256}
    assert stop_token_ids(TOKENIZER, "a") == {97}
    with pytest.raises(ValidationError, match="is 2 tokens"):
        stop_token_ids(TOKENIZER, "ab")


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.6, "top_p": 0.8, "top_k": 20}])
async def test_sampled_logprobs_are_the_models_raw_logprobs(sampler, settings):
    response = await sample(sampler, PROMPTS[1], n=4, max_tokens=20, **settings)
    scored = await asyncio.gather(
        *(
            sampler.compute_logprobs_async(ModelInput.from_ints(PROMPTS[1] + s.tokens))
            for s in response.sequences
        )
    )
    for seq, logprobs in zip(response.sequences, scored, strict=True):
        assert logprobs[0] is None and len(logprobs) == len(PROMPTS[1]) + len(seq.tokens)
        assert_close(seq.logprobs, logprobs[len(PROMPTS[1]) :])


async def test_a_sampler_keeps_the_weights_it_was_made_with(trainer, sampler):
    probe = ModelInput.from_ints(PROMPTS[0] + [65, 66, 67])
    before = await sampler.compute_logprobs_async(probe)
    drawn = await sample(sampler, PROMPTS[0])
    seq = drawn.sequences[0]
    datum = build_opd_datum(PROMPTS[0], seq.tokens, seq.logprobs, [1.0] * len(seq.tokens))
    await (await trainer.forward_backward_async([datum], "importance_sampling"))
    await (await trainer.optim_step_async(AdamParams(learning_rate=0.05)))

    assert await sampler.compute_logprobs_async(probe) == before
    fresh = await trainer.save_weights_and_get_sampling_client_async()
    after = await fresh.compute_logprobs_async(probe)
    assert not np.allclose(before[1:], after[1:], atol=1e-3)


async def test_sampling_runs_off_the_event_loop(sampler):
    ticks = 0
    sampling = asyncio.ensure_future(sample(sampler, PROMPTS[0], n=8, max_tokens=64))
    while not sampling.done():
        ticks += 1
        await asyncio.sleep(0)
    await sampling
    assert ticks > 10


async def test_prompt_logprobs_and_text_come_back_on_request(sampler):
    prompt = ModelInput.from_ints(PROMPTS[2])
    response = await sampler.sample_async(prompt, 1, params(), include_prompt_logprobs=True)
    assert response.prompt_logprobs == await sampler.compute_logprobs_async(prompt)
    seq = response.sequences[0]
    assert seq.text == TOKENIZER.decode(seq.tokens, skip_special_tokens=True)
    assert (response.input_tokens, response.output_tokens) == (len(PROMPTS[2]), len(seq.tokens))


async def test_topk_prompt_logprobs_are_the_likeliest_tokens_of_the_full_distribution(
    sampler, monkeypatch
):
    """Each position's k likeliest tokens, likeliest first, as the full log-softmax ranks
    them, from the prefill that gives the prompt logprobs (the same values); requests of
    different k share one batch, and a budget of a few positions per slice changes nothing."""
    monkeypatch.setattr(decoding, "TOPK_SLICE", 3 * sampler.vocab_size)
    prompts = [ModelInput.from_ints(PROMPTS[0]), ModelInput.from_ints(PROMPTS[1])]
    responses = await asyncio.gather(
        *(
            sampler.sample_async(
                prompt,
                1,
                params(max_tokens=1),
                include_prompt_logprobs=True,
                topk_prompt_logprobs=k,
            )
            for prompt, k in zip(prompts, (5, 2), strict=True)
        )
    )
    for prompt, k, response in zip(prompts, (5, 2), responses, strict=True):
        ids = prompt.to_ints()
        logits = sampler.forward(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
        assert response.topk_prompt_logprobs[0] is None and len(
            response.topk_prompt_logprobs
        ) == len(ids)
        for position, top in enumerate(response.topk_prompt_logprobs[1:]):
            values, tokens = logits[position].topk(k)
            assert [token for token, _ in top] == tokens.tolist()
            assert_close([value for _, value in top], values.tolist())
        assert_close(
            response.prompt_logprobs[1:], (await sampler.compute_logprobs_async(prompt))[1:]
        )
    only = await sampler.sample_async(prompts[0], 1, params(), topk_prompt_logprobs=1)
    assert only.prompt_logprobs == [] and len(only.topk_prompt_logprobs) == len(PROMPTS[0])


async def test_invalid_requests_are_refused(sampler):
    with pytest.raises(ValidationError, match="max_tokens"):
        await sampler.sample_async(ModelInput.from_ints(PROMPTS[0]), 1, SamplingParams())
    with pytest.raises(ValidationError, match="prompt cannot be empty"):
        await sampler.compute_logprobs_async(ModelInput.from_ints([]))
    with pytest.raises(ValidationError, match="top_p"):
        await sample(sampler, PROMPTS[0], top_p=0.0)
    with pytest.raises(ValidationError, match="topk_prompt_logprobs"):
        await sampler.sample_async(
            ModelInput.from_ints(PROMPTS[0]), 1, params(), topk_prompt_logprobs=-1
        )
