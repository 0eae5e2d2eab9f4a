"""A self teacher reading the feedback given on stored completions (`context: feedback`,
hindsight self-distillation), on the local backend's tiny models: the rows of a
`stored_completions` dataset are prompts (each conversation up to the answered turn), the
teacher reads each one's feedback after its last user turn while the student's prompt is
the conversation alone, and rows without feedback are left out (and counted) only when
such a teacher scores them."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.errors import OPDError
from kernel.spec import JobSpec
from kernel.spec.data import StoredRow
from tests.fakes.sinks import RecordingSink
from tests.support import assert_close
from worker.engine.backends.local import LocalServiceClient
from worker.engine.data.datasets import load_datasets
from worker.engine.data.mixing import Item, training_pools
from worker.engine.data.prompts import build_chat
from worker.engine.loop.probe import probe
from worker.engine.loop.run import open_run
from worker.engine.teachers.scoring import teacher_logprobs

CORRECTION = "Answer with the number only"
COMPLETION = [*b"It is 5.", 258]


def row(n: int, question: str, answer: str, feedback: list[str]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{n:032x}",
        "messages": [{"role": "user", "content": question}],
        "answer": answer,
        "feedback": feedback,
    }


ROWS = [
    row(1, "What is 2 + 3?", "The answer is 5.", [CORRECTION]),
    row(2, "What is 4 + 4?", "8", []),
    row(3, "What is 7 * 8?", "It is 56", ["Too wordy.", CORRECTION]),
]


def feedback_spec(teacher: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate(
        {
            "backend": "local",
            "local": {"device": "cpu"},
            "student": {"base_model": "tiny-student", "lora_rank": 8, "seed": 11},
            "teacher": teacher,
            "dataset": {"source": "stored_completions", "rows": ROWS},
            "sampling": {"max_tokens": 8},
            "loop": {"steps": 1, "batch_size": 2, "group_size": 2},
        }
    )


def test_rows_without_feedback_are_left_out_only_under_a_teacher_that_reads_it(tmp_path):
    read = load_datasets(feedback_spec({"self": {"context": "feedback"}}), tmp_path, True)
    pool = read["dataset"]
    assert [p.messages[-1].content for p in pool.prompts] == ["What is 2 + 3?", "What is 7 * 8?"]
    assert pool.answers == ["The answer is 5.", "It is 56"]
    assert pool.feedback == [CORRECTION, f"Too wordy.\n{CORRECTION}"]
    assert pool.left_out == 1

    every = load_datasets(feedback_spec({"base_model": "tiny-teacher"}), tmp_path, True)
    assert len(every["dataset"]) == 3 and every["dataset"].left_out == 0


def test_rows_none_of_which_has_feedback_are_refused_under_such_a_teacher(tmp_path):
    spec = feedback_spec({"self": {"context": "feedback"}})
    bare = spec.dataset.model_copy(update={"rows": [StoredRow.model_validate(ROWS[1])]})
    with pytest.raises(OPDError, match="none of the 1 stored completions read has feedback"):
        load_datasets(spec.model_copy(update={"dataset": bare}), tmp_path, True)


async def test_the_teacher_reads_the_feedback_after_the_conversation_the_student_does_not(
    tmp_path,
):
    spec = feedback_spec({"self": {"context": "feedback"}})
    prompts = load_datasets(spec, tmp_path, True)
    service = LocalServiceClient(spec.local, tmp_path)
    pools = training_pools(spec, prompts)
    run = await open_run(spec, service, RecordingSink(), None, pools)
    pool = pools[0]
    sampler = await run.training.save_weights_and_get_sampling_client_async()
    item = Item(pool.prompts.prompts[1], pool.prompts.answers[1], pool)
    student_prompt = run.render(item.prompt, pool.options)

    scorer = run.scorer(item, student_prompt, sampler)
    scored = await scorer.score(COMPLETION, [0.0] * len(COMPLETION))

    tokenizer = run.tokenizer
    plain = build_chat(tokenizer, [{"role": "user", "content": "What is 7 * 8?"}], False)
    told = build_chat(
        tokenizer,
        [{"role": "user", "content": f"What is 7 * 8?\n\nFeedback: Too wordy.\n{CORRECTION}"}],
        False,
    )
    assert student_prompt == plain and scorer.prompt == told
    base = await service.create_sampling_client_async("tiny-student")
    assert_close(scored.logprobs, await teacher_logprobs(base, told, COMPLETION))


async def test_a_feedback_teacher_over_another_source_is_refused(tmp_path):
    spec = JobSpec.model_validate(
        {
            "backend": "local",
            "local": {"device": "cpu"},
            "student": {"base_model": "tiny-student"},
            "teacher": {"self": {"context": "feedback"}},
            "dataset": {"source": "inline", "prompts": ["What is 1 + 1?"]},
            "loop": {"steps": 1, "batch_size": 1, "group_size": 2},
        }
    )
    service = LocalServiceClient(spec.local, tmp_path)
    pools = training_pools(spec, load_datasets(spec, tmp_path, True))
    with pytest.raises(OPDError, match="is not a dataset of them"):
        await open_run(spec, service, RecordingSink(), None, pools)


async def test_beside_a_teacher_of_another_dataset_the_probe_gives_it_only_its_own(tmp_path):
    """Route: the feedback teacher scores the stored rows, the base an inline dataset; the
    probe before step 0 scores each dataset's first completion by the teachers that can
    read it (the feedback teacher has no feedback to read on the inline prompt)."""
    spec = JobSpec.model_validate(
        {
            "backend": "local",
            "local": {"device": "cpu"},
            "student": {"base_model": "tiny-student", "lora_rank": 8, "seed": 11},
            "teachers": {
                "corrected": {"self": {"context": "feedback"}},
                "base": {"self": {"weights": "base"}},
            },
            "teacher_mixture": "route",
            "datasets": [
                {
                    "name": "served",
                    "source": "stored_completions",
                    "rows": ROWS,
                    "teacher": "corrected",
                },
                {"name": "everyday", "source": "inline", "prompts": ["Hello"], "teacher": "base"},
            ],
            "sampling": {"max_tokens": 4},
            "loop": {"steps": 1, "batch_size": 2, "group_size": 2},
        }
    )
    service = LocalServiceClient(spec.local, tmp_path)
    pools = training_pools(spec, load_datasets(spec, tmp_path, True))
    sink = RecordingSink()
    run = await open_run(spec, service, sink, None, pools)
    await probe(run, pools, 0)
    (event,) = [e for e in sink.events if e[1].startswith("Probe reverse KL per teacher")]
    kls = event[2]["reverse_kl"]
    assert set(kls) == {"corrected", "base"}
    assert all(isinstance(kl, float) for kl in kls.values())
