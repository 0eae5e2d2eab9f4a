"""`opd rotate-secrets` as an operator runs it after putting a new key first in
OPD_SECRET_KEY: every stored secret moves to the new key, so the old one can be dropped."""

from __future__ import annotations

import sqlite3
from contextlib import closing

from cryptography.fernet import Fernet
from standardwebhooks import Webhook as Signer

from app.core.config import Settings
from app.core.encryption import SecretBox
from tests.app.conftest import serve
from tests.opd.cli.test_keys import opd_keys, run_opd


async def test_rotation_moves_every_secret_to_the_first_key(tmp_path):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    key = opd_keys("create", "--team", "alpha", home=tmp_path).stdout.strip()
    settings = Settings(
        home=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'keys.db'}",
        secret_key=old,
        migrate_on_start=False,
    )
    async with serve(settings) as client:
        created = await client.post(
            "/v1/webhooks",
            json={"url": "https://hooks.example.com/x", "events": ["job.failed"]},
            headers={"Authorization": f"Bearer {key}"},
        )
    secret = created.json()["secret"]

    rotated = run_opd("rotate-secrets", home=tmp_path, OPD_SECRET_KEY=f"{new},{old}")
    assert rotated.returncode == 0, rotated.stderr
    assert "Re-encrypted 1 secret" in rotated.stdout
    with closing(sqlite3.connect(tmp_path / "keys.db")) as db:
        (sealed,) = db.execute("SELECT secret FROM webhooks").fetchone()
    assert SecretBox([new]).open(sealed) == secret
    Signer(secret)

    lost = run_opd("rotate-secrets", home=tmp_path, OPD_SECRET_KEY=old)
    assert lost.returncode == 1
    assert "opens under none of the keys" in lost.stderr and "Traceback" not in lost.stderr
