"""What the SDK does without its optional helper, pandas: a clear ImportError."""

from __future__ import annotations

import sys

import pytest

from opd.sdk import Curves


def test_without_pandas_to_pandas_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    curves = Curves.model_validate(
        {
            "job_id": 1,
            "curves": {"opd/reverse_kl_mean": {"steps": [0], "values": [1.0]}},
            "downsampling": {
                "method": "none",
                "first_step": 0,
                "last_step": 0,
                "buckets": None,
                "bucket_steps": None,
            },
        }
    )
    assert curves.points("opd/reverse_kl_mean") == [(0, 1.0)]
    with pytest.raises(ImportError, match="pip install pandas"):
        curves.to_pandas()
