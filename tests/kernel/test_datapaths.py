"""The data-root rule: relative paths resolve under it; nothing may point out of it."""

from __future__ import annotations

import pytest

from kernel.datapaths import DataPathError, confine_data_path


def test_paths_inside_the_root_resolve(tmp_path):
    (tmp_path / "sets").mkdir()
    assert confine_data_path("sets/a.jsonl", tmp_path) == tmp_path.resolve() / "sets" / "a.jsonl"
    inside = str(tmp_path / "sets" / "b.parquet")
    assert confine_data_path(inside, tmp_path) == tmp_path.resolve() / "sets" / "b.parquet"


@pytest.mark.parametrize("path", ["../x.jsonl", "/etc/passwd", "sets/../../x.jsonl", "link/x"])
def test_paths_that_leave_the_root_are_refused(tmp_path, path):
    root = tmp_path / "root"
    (root / "sets").mkdir(parents=True)
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(DataPathError, match="outside the server's data root"):
        confine_data_path(path, root)


def test_unusable_paths_are_a_clear_error(tmp_path):
    with pytest.raises(DataPathError, match="cannot be used"):
        confine_data_path("a\0b", tmp_path)
