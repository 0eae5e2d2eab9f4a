"""A cold estimate (no earlier job measured the lengths) counts prompts in the student's own
tokens where its tokenizer says how many, and a teacher with another tokenizer in tokens of
its own, with bounds wide enough to hold them (the BPE teacher's run used 16,093 tokens and
was estimated 31,972 at the least, as if it read the byte-level student's tokens)."""

from __future__ import annotations

from pathlib import Path

import yaml

from app.budgets.estimates import another_tokenizer, cold_prompt, lengths_of
from kernel.spec import JobSpec

ROOT = Path(__file__).resolve().parents[3]


def example(name: str) -> JobSpec:
    return JobSpec.model_validate(yaml.safe_load((ROOT / "examples" / name).read_text()))


def test_a_byte_level_students_prompt_is_its_bytes_and_its_template() -> None:
    spec = example("arith.yaml")
    prompt, basis = cold_prompt(spec, spec.student.base_model, {})
    # "What is 7 * 8?\n\nAnswer in \\boxed{}." is 35 bytes, 73 tokens rendered.
    assert prompt.low <= 73 <= prompt.high and abs(prompt.point - 73) <= 2
    assert "1 token a byte" in basis


def test_a_teacher_with_another_tokenizer_reads_its_own_tokens() -> None:
    same, bpe = example("arith.yaml"), example("arith-bpe.yaml")
    assert another_tokenizer(same) is None
    assert another_tokenizer(bpe) == "arith-teacher-bpe"
    lengths, basis = lengths_of(bpe, [], {})
    ratio = lengths.teacher_per_token
    assert ratio.low < 0.3 < ratio.high  # "\\boxed{56}": 10 student tokens, 3 of the BPE's
    assert lengths.teacher_prompt.low <= 17 <= lengths.teacher_prompt.high  # its prompt: 17
    assert any("tokens of its own" in line for line in basis)
    assert lengths_of(same, [], {})[0].teacher_per_token.point == 1
