"""JSON merge patches (RFC 7386): how a clone says what differs from the job it copies."""

from __future__ import annotations

from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """`target` with `patch` applied: objects merge key by key, `null` removes a key (so a
    spec field returns to its default), anything else replaces what was there."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def dotted_patch(assignments: dict[str, Any]) -> dict[str, Any]:
    """`{"optim.learning_rate": 2e-5}` as the merge patch `{"optim": {"learning_rate": 2e-5}}`."""
    patch: dict[str, Any] = {}
    for path, value in assignments.items():
        *groups, leaf = path.split(".")
        node = patch
        for group in groups:
            node = node.setdefault(group, {})
            if not isinstance(node, dict):
                raise ValueError(f"{path}: {group} is set to a value and also has fields")
        node[leaf] = value
    return patch
