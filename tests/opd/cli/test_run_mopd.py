"""`opd run` of a two-teacher spec on the local backend takes a teacher saved as a Hugging
Face folder whose chat template differs from the student's, says so before any step, and
trains, with a logit-level objective too (the trainer reads that teacher after its own
rendering of the question)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.opd.cli.test_run import opd
from worker.engine.backends.local.presets import SYSTEM_CHAT_TEMPLATE, tiny_model, tiny_tokenizer


def two_teacher_spec(tmp_path: Path, **loop: Any) -> Path:
    folder = tmp_path / "other-teacher"
    tiny_model("tiny-teacher").save_pretrained(folder)
    tiny_tokenizer(SYSTEM_CHAT_TEMPLATE).save_pretrained(folder)
    spec = {
        "backend": "local",
        "student": {"base_model": "tiny-student", "lora_rank": 8},
        "teachers": {"same": {"base_model": "tiny-teacher"}, "other": {"base_model": str(folder)}},
        "datasets": [
            {"name": "a", "source": "inline", "prompts": ["What is 2 + 3?"], "teacher": "same"},
            {"name": "b", "source": "inline", "prompts": ["What is 2 * 3?"], "teacher": "other"},
        ],
        "sampling": {"max_tokens": 4},
        "loop": {"steps": 1, "batch_size": 2, "group_size": 1, **loop},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_opd_run_scores_with_a_teacher_whose_template_renders_prompts_differently(tmp_path):
    done = opd("run", str(two_teacher_spec(tmp_path)), "--artifacts", "art", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "Teacher 'other' (" in said and "): same tokenizer, its own chat template" in said
    assert "Teacher 'same' ('tiny-teacher'): same tokenizer, same chat template" in said


def test_opd_run_trains_a_logit_level_objective_with_such_a_teacher(tmp_path):
    spec = two_teacher_spec(tmp_path, objective="reverse_kl")

    done = opd("run", str(spec), "--artifacts", "art", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert "): same tokenizer, its own chat template" in done.stdout + done.stderr
    assert Path(tmp_path, "art", "sampler").is_dir()
