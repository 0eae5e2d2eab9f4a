"""The vLLM server's gate: a request for prompt logprobs (a self teacher's `echo` score) is
never on the server beside another request of the run, since vLLM's CPU build dies on an
engine step that holds two prompts' prompt logprobs or them and a sampling request;
sampling requests go together, and one waiting to score is not starved by them."""

from __future__ import annotations

import asyncio

from worker.engine.backends.vllm import PromptLogprobsGate


async def test_a_scoring_request_is_alone_and_sampling_requests_share():
    gate = PromptLogprobsGate()
    in_flight: list[str] = []
    seen: list[tuple[str, ...]] = []

    async def request(kind: str, pause: float) -> None:
        entered = gate.alone() if kind.startswith("score") else gate.shared()
        async with entered:
            in_flight.append(kind)
            seen.append(tuple(in_flight))
            await asyncio.sleep(pause)
            in_flight.remove(kind)

    await asyncio.gather(
        request("sample-0", 0.05),
        request("sample-1", 0.05),
        request("score-0", 0.01),
        request("score-1", 0.01),
        request("sample-2", 0.01),
    )
    assert any(len(present) > 1 for present in seen), "sampling requests overlap"
    assert all(
        len(present) == 1 for present in seen if any(k.startswith("score") for k in present)
    ), seen
    order = [present[-1] for present in seen]
    assert order.index("score-1") < order.index("sample-2"), "a waiting score goes first"


async def test_a_cancelled_wait_leaves_the_gate_open():
    gate = PromptLogprobsGate()
    async with gate.shared():
        waiting = asyncio.create_task(gate.alone().__aenter__())
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    async with asyncio.timeout(1):
        async with gate.shared(), gate.shared():
            pass
        async with gate.alone():
            pass
