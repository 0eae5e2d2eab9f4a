"""`opd vllm serve`'s refusals, each one line naming what to give instead (its real start,
on SmolLM2, is tests/e2e/test_vllm.py's server), and OPD_VLLM_SERVERS as the settings read it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.config import Settings
from kernel.model_names import TINY_STUDENT
from opd.cli import main
from opd.cli.vllm import announced
from opd.vllm_server import CPU_BUILD, Environment, server_command


def test_a_byte_level_preset_is_refused_naming_what_vllm_serves(capsys):
    assert main(["vllm", "serve", TINY_STUDENT]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "byte-level preset" in err and "smollm2-135m-instruct" in err


def test_a_folder_that_is_not_there_is_refused(capsys, tmp_path):
    assert main(["vllm", "serve", str(tmp_path / "absent")]) == 1
    err = capsys.readouterr().err
    assert "is no Hugging Face model folder" in err and err.count("\n") == 1


def test_bad_options_are_refused(capsys):
    assert main(["vllm", "serve", TINY_STUDENT, "--port", "0"]) == 1
    assert "give a port from 1 to 65535" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["vllm", "serve", TINY_STUDENT, "--memory-fraction", "2"])
    assert "give a fraction above 0" in capsys.readouterr().err


def test_the_servers_map_base_models_to_urls(monkeypatch):
    monkeypatch.setenv("OPD_VLLM_SERVERS", '{"smollm2-135m-instruct": "http://127.0.0.1:8001/v1/"}')
    assert Settings().vllm_servers == {"smollm2-135m-instruct": "http://127.0.0.1:8001/v1"}
    monkeypatch.setenv("OPD_VLLM_SERVERS", '{"smollm2-135m-instruct": "127.0.0.1:8001"}')
    with pytest.raises(ValidationError, match="http:// or https:// URL"):
        Settings()


def test_a_students_server_loads_adapters_up_to_its_rank_and_a_teachers_none(tmp_path):
    """vLLM pads every adapter to --max-lora-rank (16 unless told); a teacher's server
    (`--teacher`) loads none: vLLM's CPU build fails to score batched prompts with LoRA on."""
    env = Environment(tmp_path, CPU_BUILD)
    student = server_command(env, "/models/m", 8001)
    assert student[student.index("--max-lora-rank") + 1] == "16" and "--enable-lora" in student
    teacher = server_command(env, "/models/m", 8001, max_lora_rank=None)
    assert "--enable-lora" not in teacher and "--max-lora-rank" not in teacher
    url = "http://127.0.0.1:8001/v1"
    assert announced("m", url, 16)[1] == "For the API: export OPD_VLLM_MAX_LORA_RANKS='{\"m\": 16}'"
    lines = announced("m", url, None)
    assert f"export OPD_TEACHER_SERVERS='{{\"{url}\": null}}'" in lines[0]
    assert lines[1] == f"A spec's teacher: {{server: {{url: {url}, model: m}}}}"
