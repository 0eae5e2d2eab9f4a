"""`opd run` of a two-teacher spec on the local backend refuses, before any step, a teacher
saved as a Hugging Face folder whose chat template differs from the student's."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.opd.cli.test_run import opd
from worker.engine.backends.local.presets import tiny_model, tiny_tokenizer


def test_opd_run_refuses_a_teacher_whose_template_renders_prompts_differently(tmp_path):
    folder = tmp_path / "other-teacher"
    tiny_model("tiny-teacher").save_pretrained(folder)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = tokenizer.chat_template.replace("assistant", "helper")
    tokenizer.save_pretrained(folder)
    spec = {
        "backend": "local",
        "student": {"base_model": "tiny-student", "lora_rank": 8},
        "teachers": {"same": {"base_model": "tiny-teacher"}, "other": {"base_model": str(folder)}},
        "datasets": [
            {"name": "a", "source": "inline", "prompts": ["What is 2 + 3?"], "teacher": "same"},
            {"name": "b", "source": "inline", "prompts": ["What is 2 * 3?"], "teacher": "other"},
        ],
        "sampling": {"max_tokens": 4},
        "loop": {"steps": 1, "batch_size": 2, "group_size": 1},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))

    done = opd("run", str(path), "--artifacts", "art", cwd=tmp_path)

    assert done.returncode != 0
    assert "[incompatible_models] teacher 'other'" in done.stderr
    assert "chat template renders 'What is 2 + 3?' differently: at position" in done.stderr
    assert not Path(tmp_path, "art", "state").exists()  # no step was taken
