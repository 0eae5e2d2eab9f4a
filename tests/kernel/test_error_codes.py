"""The error reference stays complete: every code the service's code raises or answers with
is listed in kernel/error_codes.py, and nothing listed is a code no code uses."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from app.api.errors import STATUS_CODES
from kernel.error_codes import ERROR_CODES

ROOT = Path(__file__).resolve().parents[2]
CODE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)?$")


def codes_in(tree: ast.AST) -> set[str]:
    """String codes given as `code="..."`, assigned to `code`, or as the second argument
    after an HTTP status (`FileRefused(422, "unusable_file", ...)`)."""
    given = [code_given(node) for node in ast.walk(tree)]
    return {
        value.value
        for value in given
        if isinstance(value, ast.Constant)
        and isinstance(value.value, str)
        and CODE.match(value.value)
    }


def code_given(node: ast.AST) -> ast.expr | None:
    if isinstance(node, ast.keyword) and node.arg == "code":
        return node.value
    if isinstance(node, ast.Assign):
        named = any(isinstance(t, ast.Name) and t.id == "code" for t in node.targets)
        return node.value if named else None
    if isinstance(node, ast.Call) and len(node.args) >= 2:
        status = node.args[0]
        is_status = isinstance(status, ast.Constant) and isinstance(status.value, int)
        return node.args[1] if is_status and 400 <= status.value < 600 else None
    return None


def used_codes() -> set[str]:
    codes = set(STATUS_CODES.values())
    for package in ("app", "worker", "kernel", "opd"):
        for path in (ROOT / package).rglob("*.py"):
            codes |= codes_in(ast.parse(path.read_text(encoding="utf-8")))
    return codes


def test_every_code_the_code_uses_is_documented() -> None:
    assert sorted(used_codes() - ERROR_CODES.keys()) == []


def test_every_documented_code_is_used() -> None:
    assert sorted(ERROR_CODES.keys() - used_codes()) == []


def test_the_scan_finds_codes_in_each_of_their_shapes() -> None:
    tree = ast.parse(
        'raise OPDError("x", code="a_code")\ncode = "b_code"\nFileRefused(422, "c_code", "m")\n'
        'FileRefused(422, "A form message.")'
    )
    assert codes_in(tree) == {"a_code", "b_code", "c_code"}
