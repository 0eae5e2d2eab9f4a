"""A sampler that disagrees with its trainer (loop.sampler_correction): the tiny student
samples from a copy of itself whose numerics fail at one position in five (its logits there
perturbed by N(0, 4^2), as a low-precision or routing fault perturbs them), and reports that
copy's logprobs. Trained as they come, the tokens of those positions, with importance ratios
far from 1 and advantages that subtract a logprob the trainer never had, slow the student's
reverse KL to its teacher; masked or truncated, it falls as with a sampler that agrees. The
reverse KL measured is the student's own (its trainer's weights, sampled and scored after
the run), not the one the steps report from the sampler's logprobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from pytrio.types import ModelInput, SamplingParams

from kernel.spec import JobSpec
from tests.fakes.sinks import RecordingSink
from worker.engine.backends.local import LocalServiceClient, LocalTrainingClient
from worker.engine.backends.local.models import ModelCache
from worker.engine.backends.local.sampler import LocalSamplingClient
from worker.engine.data.datasets import load_datasets
from worker.engine.loop.steps import run_loop

ROOT = Path(__file__).resolve().parents[4]
STEPS = 40
FAULTY = 0.2
NOISE = 4.0
HELD_OUT = ["What is 9 - 4?", "Compute 6 * 7.", "Is 21 a prime number?", "Solve x + 2 = 5."]


class FaultySampler(LocalSamplingClient):
    """The student's sampler with its logits perturbed at a seeded fifth of the positions."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.noise = torch.Generator().manual_seed(7)

    def forward(self, **kwargs: Any) -> Any:
        out = super().forward(**kwargs)
        shape = out.logits.shape
        faulty = torch.rand(shape[:-1], generator=self.noise) < FAULTY
        out.logits += torch.randn(shape, generator=self.noise) * NOISE * faulty.unsqueeze(-1)
        return out


class FaultyTrainer(LocalTrainingClient):
    async def save_weights_and_get_sampling_client_async(self) -> LocalSamplingClient:
        weights, version = await self.runner.submit(self.snapshot)
        return FaultySampler(
            self.runner, self.model, self.tokenizer, self.placement, weights, version
        )


class Service(LocalServiceClient):
    """The local backend whose training client (`faulty`: its samplers) is kept."""

    def __init__(self, faulty: bool, *args: Any) -> None:
        super().__init__(*args)
        self.faulty = faulty
        self.trained: LocalTrainingClient | None = None

    def training_client(
        self, base_model: str, rank: int, seed: int, models: ModelCache
    ) -> LocalTrainingClient:
        client = super().training_client(base_model, rank, seed, models)
        if self.faulty:
            client.__class__ = FaultyTrainer  # the same client, its samplers faulty
        self.trained = client
        return client


async def student_reverse_kl(service: Service, spec: JobSpec) -> float:
    """The trained student's mean reverse KL to the teacher on held-out prompts: its own
    samples (16 a prompt), its own logprobs and the teacher's."""
    assert service.trained is not None
    student = await LocalTrainingClient.save_weights_and_get_sampling_client_async(service.trained)
    teacher = await service.create_sampling_client_async(spec.teacher.base_model)
    tokenizer = service.trained.tokenizer
    params = SamplingParams(max_tokens=spec.sampling.max_tokens, temperature=1.0, seed=3)
    kls = []
    for question in HELD_OUT:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer.encode(text, add_special_tokens=False)
        sampled = await student.sample_async(ModelInput.from_ints(prompt), 16, params)
        for sequence in sampled.sequences:
            scored = ModelInput.from_ints(prompt + list(sequence.tokens))
            theirs = (await teacher.compute_logprobs_async(scored))[len(prompt) :]
            kls.append(np.asarray(sequence.logprobs) - np.asarray(theirs, dtype=np.float64))
    return float(np.concatenate(kls).mean())


def tiny(correction: str) -> JobSpec:
    raw = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    raw["eval"] = None
    raw["loop"] |= {"steps": STEPS, "sampler_correction": correction}
    raw["local"] |= {"device": "cpu", "cpu_threads": 1}
    return JobSpec.model_validate(raw)


async def trained(folder: Path, faulty: bool, correction: str) -> tuple[float, RecordingSink]:
    """The student's reverse KL after the run, and what the run reported."""
    spec = tiny(correction)
    service = Service(faulty, spec.local, folder)
    sink = RecordingSink()
    await run_loop(spec, service, load_datasets(spec, folder, False, None), sink)
    return await student_reverse_kl(service, spec), sink


def mismatch_notes(sink: RecordingSink) -> list[dict[str, Any]]:
    return [
        data for level, _, data in sink.events if data and data.get("note") == "sampler_mismatch"
    ]


async def test_a_disagreeing_sampler_stalls_the_student_unless_its_tokens_are_gated(
    tmp_path: Path,
) -> None:
    spec = tiny("none")
    untrained = Service(False, spec.local, tmp_path)
    await untrained.create_lora_training_client_async(
        spec.student.base_model, spec.student.lora_rank, spec.student.seed
    )
    before = await student_reverse_kl(untrained, spec)
    agreeing, agreed = await trained(tmp_path / "agreeing", False, "mask")
    uncorrected, _ = await trained(tmp_path / "none", True, "none")
    masked, gated = await trained(tmp_path / "mask", True, "mask")
    truncated, _ = await trained(tmp_path / "truncate", True, "truncate")

    learned = before - agreeing
    figures = {"before": before, "agreeing": agreeing, "none": uncorrected, "mask": masked}
    figures["truncate"] = truncated
    assert learned > 0.5, figures
    assert before - uncorrected < 0.7 * learned, figures
    assert before - masked > 0.85 * learned, figures
    assert before - truncated > 0.75 * learned, figures
    # A sampler that agrees has no token out of bounds, and no note; a faulty one has both.
    assert all(m["opd/sampler_ratio_outside_fraction"] == 0 for m in agreed.steps.values())
    assert not mismatch_notes(agreed)
    outside = [m["opd/sampler_ratio_outside_fraction"] for m in gated.steps.values()]
    assert min(outside) > 0.05, outside
    (note,) = mismatch_notes(gated)
    assert note["step"] == 0 and note["fraction"] == outside[0]
