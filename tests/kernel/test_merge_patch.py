"""JSON merge patches (RFC 7386), as a clone applies them, and `--set` paths as patches."""

from __future__ import annotations

import pytest

from kernel.merge_patch import dotted_patch, merge_patch

SPEC = {"name": "a", "optim": {"learning_rate": 0.1, "beta1": 0.9}, "eval": {"every": 5}}


def test_objects_merge_null_removes_and_anything_else_replaces():
    patch = {"optim": {"learning_rate": 2e-5}, "eval": None, "name": ["b"], "loop": {"steps": 3}}
    assert merge_patch(SPEC, patch) == {
        "name": ["b"],
        "optim": {"learning_rate": 2e-5, "beta1": 0.9},
        "loop": {"steps": 3},
    }
    assert SPEC["optim"]["learning_rate"] == 0.1  # the target is left as it was
    assert merge_patch(SPEC, {}) == SPEC
    assert merge_patch(SPEC, [1]) == [1]


def test_dotted_fields_become_a_patch():
    assert dotted_patch({"optim.learning_rate": 2e-5, "optim.beta1": 0.8, "name": "x"}) == {
        "optim": {"learning_rate": 2e-5, "beta1": 0.8},
        "name": "x",
    }
    with pytest.raises(ValueError, match="optim is set to a value and also has fields"):
        dotted_patch({"optim": 1, "optim.beta1": 0.8})
