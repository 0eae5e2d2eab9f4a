"""`opd keys` as an operator runs it: a real process on a SQLite file, then the API on it."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from app.core.config import Settings
from tests.app.conftest import serve

ROOT = Path(__file__).resolve().parents[3]


def opd_keys(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return run_opd("keys", *args, home=home)


def run_opd(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`opd ARGS` on the SQLite file `home/keys.db` (with more OPD_* settings in `env`)."""
    return subprocess.run(
        [sys.executable, "-m", "opd.cli", *args],
        cwd=home,
        capture_output=True,
        text=True,
        env=os.environ
        | {
            "PYTHONPATH": str(ROOT),
            "OPD_HOME": str(home),
            "OPD_DATABASE_URL": f"sqlite:///{home / 'keys.db'}",
        }
        | env,
        timeout=120,
    )


def database_bytes(home: Path) -> bytes:
    """Every byte SQLite keeps for the database (its journal files included)."""
    return b"".join(path.read_bytes() for path in sorted(home.glob("keys.db*")))


async def test_a_key_is_shown_once_stored_hashed_listed_by_prefix_and_revocable(tmp_path):
    created = opd_keys("create", "--team", "alpha", home=tmp_path)

    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert created.stdout == f"{key}\n", "stdout holds the key and nothing else"
    assert "shown only this once" in created.stderr
    assert f"in the database {tmp_path / 'keys.db'};" in created.stderr  # the one it wrote
    _, prefix, secret = key.split("_", 2)
    with closing(sqlite3.connect(tmp_path / "keys.db")) as db:
        rows = db.execute(
            "SELECT prefix, key_hash, revoked_at FROM api_keys JOIN teams "
            "ON teams.id = api_keys.team_id WHERE teams.name = 'alpha'"
        ).fetchall()
    assert rows == [(prefix, hashlib.sha256(key.encode()).hexdigest(), None)]
    stored = database_bytes(tmp_path)
    assert key.encode() not in stored
    assert secret.encode() not in stored

    listed = opd_keys("list", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert f"{prefix}  team=alpha" in listed.stdout
    assert "active" in listed.stdout
    assert secret not in listed.stdout

    settings = Settings(
        home=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'keys.db'}",
        migrate_on_start=False,
        auth_cache_seconds=0,
    )
    headers = {"Authorization": f"Bearer {key}"}
    async with serve(settings) as client:
        assert (await client.get("/v1/jobs", headers=headers)).status_code == 200

        revoked = opd_keys("revoke", prefix, home=tmp_path)
        assert revoked.returncode == 0, revoked.stderr

        rejected = await client.get("/v1/jobs", headers=headers)
        assert rejected.status_code == 401
        assert rejected.json()["error"]["message"] == "unknown or revoked API key"
    assert "revoked" in opd_keys("list", home=tmp_path).stdout

    again = opd_keys("revoke", prefix, home=tmp_path)
    assert again.returncode == 1
    assert f"no key with prefix {prefix!r}" in again.stderr
