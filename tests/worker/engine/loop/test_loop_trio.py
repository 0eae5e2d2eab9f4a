"""The OPD loop against the fake PyTRIO service, which validates with PyTRIO's own code."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pytrio.errors.base import ValidationError
from pytrio.types import AdamParams, Datum, ModelInput

from kernel.errors import BackendFailure
from kernel.spec import FileDataset, JobSpec, SpecError, TrioBackendSpec, parse_spec
from tests.fakes.sinks import REFERENCE_METRICS, RecordingSink
from tests.fakes.trio import FakeServiceClient, patch_pytrio
from tests.support import assert_close, named
from worker.engine.backends.local.presets import tiny_tokenizer
from worker.engine.backends.trio import connect_trio
from worker.engine.data.mixing import batch_indices
from worker.engine.data.prompts import Prompts, build_prompt
from worker.engine.loop.job import run_job
from worker.engine.loop.state import SavedState, Stop
from worker.engine.loop.steps import run_loop
from worker.engine.rollouts.datums import build_opd_datum

PROMPTS = ["What is 1 + 1?", "Name a prime.", "Is 9 square?"]


def make_spec(**loop: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": "trio",
            "student": {"base_model": "student/model", "lora_rank": 8},
            "teacher": {"base_model": "teacher/model"},
            "dataset": {"source": "inline", "prompts": PROMPTS, "question_suffix": "Box it."},
            "sampling": {"max_tokens": 6},
            "optim": {
                "learning_rate": 1e-4,
                "beta1": 0.8,
                "beta2": 0.9,
                "eps": 1e-8,
                "weight_decay": 0.01,
                "grad_clip_norm": 1.0,
            },
            "loop": {"batch_size": 2, "group_size": 2, **loop},
        }
    )


async def run(spec: JobSpec, fake: FakeServiceClient, **kwargs: Any) -> RecordingSink:
    sink = RecordingSink()
    await run_loop(spec, fake, Prompts(PROMPTS, [None] * len(PROMPTS)), sink, **kwargs)
    return sink


def without_timing(metrics: dict[str, float]) -> dict[str, float]:
    return {
        k: v
        for k, v in metrics.items()
        if not k.startswith("time/") and k != "data/completion_tokens_per_second"
    }


def completion_part(datum: Datum, prompt_len: int) -> dict[str, list[float]]:
    """The completion slice of a datum's loss inputs (the prompt part is padding)."""
    pad = prompt_len - 1
    return {name: tensor.data[pad:] for name, tensor in datum.loss_fn_inputs.items()}


async def test_each_step_trains_on_batches_that_pass_pytrio_validation(monkeypatch) -> None:
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    spec = make_spec(steps=3)

    sink = await run(spec, connect_trio(TrioBackendSpec()))

    batches = fake.calls_named("forward_backward")
    assert len(batches) == 3
    for call in batches:
        assert call.args["loss_fn"] == "importance_sampling"
        assert call.args["plan"].totals.total_samples == 4  # batch_size * group_size
    assert sorted(sink.steps) == [0, 1, 2]
    assert fake.calls_named("create_lora_training_client")[0].args == {
        "base_model": "student/model",
        "rank": 8,
        "seed": 42,
    }
    assert fake.calls_named("create_sampling_client")[0].args == {
        "base_model": "teacher/model",
        "model_path": None,
    }


async def test_run_job_wires_the_dataset_and_the_trio_backend(monkeypatch, tmp_path) -> None:
    fake = FakeServiceClient()
    patch_pytrio(monkeypatch, fake)
    (tmp_path / "prompts.jsonl").write_text("".join(f'{{"q": "{p}"}}\n' for p in PROMPTS))
    spec = make_spec(steps=1).model_copy(
        update={"dataset": FileDataset(path="prompts.jsonl", field="q", sample_size=2)}
    )
    sink = RecordingSink()

    result = await run_job(
        spec, sink, artifact_dir=tmp_path / "artifacts", data_root=tmp_path, confine_data=True
    )

    assert result.final_weights_path == fake.calls_named("save_weights")[-1].args["path"]
    assert sink.info is not None and sink.info.dataset_size == 2
    assert sink.closed


async def test_datums_hold_the_sampled_tokens_and_the_teachers_reverse_kl() -> None:
    fake = FakeServiceClient()
    spec = make_spec(steps=2)
    tokenizer = tiny_tokenizer()

    await run(spec, fake)

    samples = iter(fake.calls_named("sample"))
    teacher = await fake.create_sampling_client_async("teacher/model")
    for step, call in enumerate(fake.calls_named("forward_backward")):
        datums = iter(call.args["data"])
        for index in batch_indices(step, 2, len(PROMPTS)):
            prompt = build_prompt(tokenizer, PROMPTS[index], "Box it.", False)
            sample = next(samples)
            assert sample.args["request"].prompt.chunks[0].tokens == prompt
            for seq in sample.args["response"].sequences:
                datum = next(datums)
                part = completion_part(datum, len(prompt))
                assert part["target_tokens"] == seq.tokens
                assert_close(part["logprobs"], seq.logprobs, rtol=1e-6)
                teacher_lps = teacher.prompt_logprobs(prompt + seq.tokens)[len(prompt) :]
                reverse_kl = np.subtract(seq.logprobs, teacher_lps)
                assert_close(part["advantages"], -reverse_kl, rtol=1e-6)


async def test_step_metrics_have_the_reference_names_and_values() -> None:
    fake = FakeServiceClient()
    spec = make_spec(steps=2)

    sink = await run(spec, fake)

    for step, call in enumerate(fake.calls_named("forward_backward")):
        metrics = sink.steps[step]
        assert metrics.keys() >= REFERENCE_METRICS
        trainer = {key for key in metrics if key.startswith("trainer/")}
        assert trainer == {"trainer/loss_sum", "trainer/loss_mean", "trainer/token_count"}

        samples = call.args["plan"].chunks[0].samples
        counts = [
            len(seq.tokens)
            for sample_call in fake.calls_named("sample")[2 * step : 2 * step + 2]
            for seq in sample_call.args["response"].sequences
        ]
        advantages = np.concatenate(
            [s.advantages[-n:] for s, n in zip(samples, counts, strict=True)]
        )
        assert metrics["data/datums"] == 4
        assert metrics["data/completion_tokens_total"] == sum(counts)
        assert metrics["data/completion_tokens_mean"] == pytest.approx(np.mean(counts))
        assert metrics["data/completion_tokens_per_second"] == pytest.approx(
            sum(counts) / metrics["time/step_elapsed_time"]
        )
        assert metrics["opd/reverse_kl_mean"] == pytest.approx(-advantages.mean(), abs=1e-5)
        assert metrics["opd/reverse_kl_std"] == pytest.approx(advantages.std(), abs=1e-5)
        assert metrics["train/learning_rate"] == 1e-4
        assert metrics["trainer/loss_sum"] == pytest.approx(-advantages.sum(), abs=1e-4)


async def test_optim_step_gets_the_specs_adam_params() -> None:
    fake = FakeServiceClient()

    await run(make_spec(steps=2), fake)

    expected = AdamParams(
        learning_rate=1e-4, beta1=0.8, beta2=0.9, eps=1e-8, weight_decay=0.01, grad_clip_norm=1.0
    )
    assert [call.args["adam_params"] for call in fake.calls_named("optim_step")] == [
        expected,
        expected,
    ]


async def test_sampler_is_refreshed_every_sampler_refresh_steps() -> None:
    fake = FakeServiceClient()

    await run(make_spec(steps=5, sampler_refresh_steps=2), fake)

    refreshed_after = [call.args["optimizer_steps"] for call in fake.calls_named("refresh_sampler")]
    assert refreshed_after == [0, 2, 4]
    versions_per_step = [call.args["version"] for call in fake.calls_named("sample")][::2]
    assert versions_per_step == [0, 0, 2, 2, 4]


async def test_checkpoints_on_schedule_and_a_final_state_and_weights() -> None:
    """The final state lets another job continue this one (`student.init_from`)."""
    fake = FakeServiceClient()
    spec = make_spec(steps=5, save_every=2, save_weights_name="my-run")

    sink = await run(spec, fake)

    saves = {
        call.args["path"]: call.args
        for call in fake.calls
        if call.name in ("save_state", "save_weights")
    }
    assert [(step, kind) for step, kind, _ in sink.checkpoints] == [
        (2, "state"),
        (2, "sampler"),
        (4, "state"),
        (4, "sampler"),
        (5, "state"),
        (5, "final"),
    ]
    assert [
        (saves[path]["name"], saves[path]["optimizer_steps"]) for _, _, path in sink.checkpoints
    ] == [
        ("my-run-state-000002", 2),
        ("my-run-000002", 2),
        ("my-run-state-000004", 4),
        ("my-run-000004", 4),
        ("my-run-state-000005", 5),
        ("my-run", 5),
    ]


async def test_without_save_weights_name_a_job_saves_under_its_own_name() -> None:
    fake = FakeServiceClient()
    spec = JobSpec.model_validate(make_spec(steps=2).model_dump() | {"name": "arith-lr-3e-3"})

    sink = await run(spec, fake)

    names = [
        call.args["name"] for call in fake.calls if call.name in ("save_state", "save_weights")
    ]
    assert names == ["arith-lr-3e-3-state-000002", "arith-lr-3e-3"]
    assert [kind for _, kind, _ in sink.checkpoints] == ["state", "final"]


async def test_a_stop_right_after_a_scheduled_save_reuses_that_state() -> None:
    """PyTRIO refuses a state name saved twice in a run (the fake too): the stop at the
    boundary just saved must not save it again."""
    fake = FakeServiceClient()
    sink = RecordingSink()
    spec = make_spec(steps=6, save_every=2)

    result = await run_loop(
        spec,
        fake,
        Prompts(PROMPTS, [None] * 3),
        sink,
        should_stop=lambda: Stop.resume if len(sink.steps) == 2 else None,
    )

    assert result.stopped and result.steps_done == 2
    saves = fake.calls_named("save_state")
    assert [call.args["name"] for call in saves] == ["opd-deepmath-qwen35-4b-state-000002"]
    assert result.state == SavedState(saves[0].args["path"], 2)


async def test_a_stop_at_the_step_a_run_resumed_from_saves_nothing_new() -> None:
    fake = FakeServiceClient()
    spec = make_spec(steps=4, save_every=2)
    whole = await run(spec, fake)
    state = SavedState(whole.checkpoints[0][2], 2)
    saves_before = len(fake.calls_named("save_state"))

    result = await run_loop(
        spec,
        fake,
        Prompts(PROMPTS, [None] * 3),
        RecordingSink(),
        resume=state,
        should_stop=lambda: Stop.resume,
    )

    assert result.state == state and result.steps_done == 2
    assert len(fake.calls_named("save_state")) == saves_before


async def test_a_run_resumed_at_its_end_keeps_that_state_as_its_final_one() -> None:
    fake = FakeServiceClient()
    spec = make_spec(steps=4, save_every=2)
    whole = await run(spec, fake)
    [final_state] = [path for step, kind, path in whole.checkpoints if (step, kind) == (4, "state")]
    saves_before = len(fake.calls_named("save_state"))
    sink = RecordingSink()

    result = await run_loop(
        spec, fake, Prompts(PROMPTS, [None] * 3), sink, resume=SavedState(final_state, 4)
    )

    assert result.final_weights_path is not None
    assert len(fake.calls_named("save_state")) == saves_before
    assert [(step, kind) for step, kind, _ in sink.checkpoints] == [(4, "final")]


@pytest.mark.parametrize(
    ("loss_fn", "config", "sent"),
    [
        ("importance_sampling", {}, None),
        ("ppo", {}, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
        (
            "cispo",
            {"clip_high_threshold": 2.0},
            {"clip_low_threshold": 0.0, "clip_high_threshold": 2.0},
        ),
        ("dro", {"beta": 0.5}, {"beta": 0.5}),
    ],
)
async def test_every_policy_loss_reaches_the_backend_with_its_options(loss_fn, config, sent):
    fake = FakeServiceClient()
    await run(make_spec(steps=1, loss_fn=loss_fn, loss_fn_config=config), fake)
    [call] = fake.calls_named("forward_backward")
    assert (call.args["loss_fn"], call.args["loss_fn_config"]) == (loss_fn, sent)


def test_cross_entropy_is_refused_for_opd_datums() -> None:
    with pytest.raises(SpecError, match=r"loop\.loss_fn"):
        parse_spec(named({"loop": {"loss_fn": "cross_entropy"}}))


async def test_every_step_says_where_its_time_went() -> None:
    sink = await run(make_spec(steps=3, save_every=1), FakeServiceClient())
    phases = {"sampler_refresh", "sample", "teacher", "train", "save"}
    for metrics in sink.steps.values():
        assert {f"time/{p}" for p in phases} <= metrics.keys()
        assert all(metrics[f"time/{p}"] >= 0 for p in phases)
        assert (
            sum(metrics[f"time/{p}"] for p in phases - {"save"})
            <= metrics["time/step_elapsed_time"] + 1e-3
        )
    assert sink.steps[0]["time/save"] == 0.0, "nothing was saved before the first step"


async def test_a_run_resumed_from_a_saved_state_repeats_the_uninterrupted_steps() -> None:
    fake = FakeServiceClient()
    spec = make_spec(steps=4, save_every=2)
    whole = await run(spec, fake)
    state = next(path for step, kind, path in whole.checkpoints if (step, kind) == (2, "state"))

    resumed = await run(spec, fake, resume=SavedState(state, 2))

    assert sorted(resumed.steps) == [2, 3]
    for step in (2, 3):
        assert without_timing(resumed.steps[step]) == without_timing(whole.steps[step])


async def test_a_teacher_with_another_tokenizer_trains_in_cross_tokenizer_mode() -> None:
    """Once refused: a teacher whose tokenizer has one more token now reads the completion's
    text as its own tokens, and the run trains on the student's datums."""
    other = tiny_tokenizer()
    other.add_tokens(["<extra>"])
    fake = FakeServiceClient(tokenizers={"teacher/model": other})

    sink = await run(make_spec(steps=2), fake)

    assert [e[2]["mode"] for e in sink.events if e[2] and e[2].get("mode")] == ["cross"]
    assert len(fake.calls_named("forward_backward")) == 2
    # The fake samples any bytes; invalid UTF-8 is text the teacher reads otherwise.
    assert all(0 < m["opd/aligned_bytes_fraction"] <= 1 for m in sink.steps.values())


async def test_missing_teacher_logprob_inside_the_completion_fails_the_step() -> None:
    fake = FakeServiceClient(drop_last_logprob=True)

    with pytest.raises(BackendFailure, match="Invalid teacher logprobs for completion tokens"):
        await run(make_spec(steps=1), fake)
    assert not fake.calls_named("forward_backward")


# The fake is only worth something if it refuses what PyTRIO refuses.


def valid_datum() -> Datum:
    return build_opd_datum([1, 2, 3], [4, 5], [-1.0, -2.0], [0.5, -0.5])


def malformed(name: str, value: Any) -> Datum:
    datum = valid_datum()
    return Datum(
        model_input=datum.model_input, loss_fn_inputs={**datum.loss_fn_inputs, name: value}
    )


@pytest.mark.parametrize(
    ("datum", "error"),
    [
        (malformed("target_tokens", np.array([0.0, 0, 4, 5], np.float32)), "dtype int64"),
        (malformed("logprobs", np.zeros(3, np.float32)), r"logprobs must have shape \[4\]"),
        (malformed("advantages", np.array([0, 0, np.nan, 1], np.float32)), "must be finite"),
        (malformed("target_tokens", np.array([0, 0, 4, 999], np.int64)), "outside the tokenizer"),
        (
            Datum(
                model_input=ModelInput.from_ints([1, 2, 3, 4]),
                loss_fn_inputs={"target_tokens": np.array([0, 0, 4, 5], np.int64)},
            ),
            "logprobs is required",
        ),
    ],
)
async def test_fake_rejects_what_pytrio_rejects(datum: Datum, error: str) -> None:
    fake = FakeServiceClient()
    training = await fake.create_lora_training_client_async("student/model", rank=8)

    with pytest.raises((ValueError, ValidationError), match=error):
        await training.forward_backward_async([datum], loss_fn="importance_sampling")
    assert not fake.calls_named("forward_backward")
    await training.forward_backward_async([valid_datum()], loss_fn="importance_sampling")
    assert len(fake.calls_named("forward_backward")) == 1


async def test_fake_insists_on_pytrio_types_and_lora_ranks() -> None:
    fake = FakeServiceClient()
    training = await fake.create_lora_training_client_async("student/model", rank=4)

    with pytest.raises(TypeError, match="Datum"):
        await training.forward_backward_async([valid_datum().model_dump()], "importance_sampling")
    with pytest.raises(TypeError, match="AdamParams"):
        await training.optim_step_async({"learning_rate": 1e-4})
    for rank in (3, 65):
        with pytest.raises(ValidationError, match=r"rank must be in \[4, 64\]"):
            await fake.create_lora_training_client_async("student/model", rank=rank)
