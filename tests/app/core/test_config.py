"""Settings: everything under OPD_HOME unless set on its own; a worker's file cache keeps the
table bounds OPD_MAX_UPLOAD_BYTES sets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.config import Settings
from app.core.storage import file_cache
from kernel.tables.bounds import TableLimits


def test_defaults_live_under_home(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    settings = Settings(home=tmp_path / "svc")
    assert settings.database_url == f"sqlite:///{tmp_path / 'svc' / 'opd.db'}"
    assert settings.artifact_root == tmp_path / "svc" / "artifacts"
    assert settings.data_root == tmp_path / "svc" / "data"
    assert settings.redis_url is None
    assert (settings.worker_concurrency, settings.heartbeat_interval) == (1, 5.0)
    assert (settings.heartbeat_timeout, settings.max_body_bytes) == (60.0, 1024 * 1024)
    assert settings.migrate_on_start is True


def test_environment_overrides(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPD_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("OPD_DATA_ROOT", "/srv/data")
    monkeypatch.setenv("OPD_REDIS_URL", "")
    monkeypatch.setenv("OPD_WORKER_CONCURRENCY", "4")
    monkeypatch.setenv("OPD_MIGRATE_ON_START", "false")
    settings = Settings()
    assert settings.data_root == Path("/srv/data")
    assert settings.artifact_root == tmp_path / "h" / "artifacts"
    assert settings.redis_url is None, "an empty variable means unset"
    assert settings.worker_concurrency == 4
    assert settings.migrate_on_start is False


def test_the_requeue_interval_is_named_apart_from_the_sweeps_and_its_old_name_still_read(
    monkeypatch, tmp_path
):
    """OPD_SWEEP_INTERVAL (lost jobs) beside OPD_SWEEPS_INTERVAL (hyperparameter sweeps)
    read as one typo from the other: the first is OPD_REQUEUE_INTERVAL now."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPD_SWEEP_INTERVAL", "3")
    monkeypatch.setenv("OPD_SWEEPS_INTERVAL", "7")
    assert (Settings().requeue_interval, Settings().sweeps_interval) == (3.0, 7.0)
    monkeypatch.setenv("OPD_REQUEUE_INTERVAL", "4")
    assert Settings().requeue_interval == 4.0, "the new name wins"
    assert Settings(requeue_interval=2).requeue_interval == 2.0


def test_the_default_home_is_dot_opd_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in ("OPD_HOME", "OPD_DATABASE_URL", "OPD_ARTIFACT_ROOT", "OPD_DATA_ROOT"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.home == tmp_path / ".opd"
    assert settings.database_url == f"sqlite:///{tmp_path / '.opd' / 'opd.db'}"


def test_bad_values_name_the_setting(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPD_WORKER_CONCURRENCY", "0")
    with pytest.raises(ValidationError, match="worker_concurrency"):
        Settings()


def test_a_workers_file_cache_bounds_tables_by_the_upload_limit(tmp_path):
    cache = file_cache(Settings(home=tmp_path, max_upload_bytes=4096), team_id=1)
    assert cache.table_limits == TableLimits.for_uploads(4096)
    assert cache.table_limits.unpacked_bytes == 4 * 4096
