"""Migration 0005 on a database filled at revision 0004 with plaintext webhook secrets:
each becomes a token under the service's first key that opens to the same secret, a second
run changes nothing, the workers sign with it, and the downgrade gives the plaintext back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic import command
from cryptography.fernet import Fernet
from sqlalchemy import MetaData, Table, select

from app.core.config import Settings
from app.core.db import (
    alembic_config,
    create_db_engine,
    create_sync_engine,
    migrate,
    session_factory,
)
from app.core.encryption import SecretBox
from app.webhooks.store import new_secret, take_due
from tests.support import migrated_database

NOW = datetime(2026, 11, 30, tzinfo=UTC)
SECRETS = [new_secret(), new_secret()]


@pytest.fixture(params=["sqlite", "postgres"])
def old_database(request, tmp_path) -> Iterator[str]:
    """A database at revision 0004 with two webhooks whose secrets are in plaintext, and
    a delivery due to the first."""
    with migrated_database(request.param, tmp_path, fill) as url:
        yield url


def fill(url: str) -> None:
    migrate(url, "0004")
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            tables = MetaData()
            teams, webhooks, deliveries = (
                Table(name, tables, autoload_with=conn)
                for name in ("teams", "webhooks", "webhook_deliveries")
            )
            team_id = conn.execute(
                teams.insert().values(name="old", created_at=NOW).returning(teams.c.id)
            ).scalar_one()
            for secret in SECRETS:
                hook_id = conn.execute(
                    webhooks.insert()
                    .values(
                        team_id=team_id,
                        url="https://a.example/h",
                        events=["job.failed"],
                        secret=secret,
                        created_at=NOW,
                    )
                    .returning(webhooks.c.id)
                ).scalar_one()
            conn.execute(
                deliveries.insert().values(
                    webhook_id=hook_id,
                    event="job.failed",
                    message_id="msg_old",
                    payload={},
                    status="pending",
                    attempts=0,
                    created_at=NOW,
                    next_attempt_at=NOW,
                    retry_until=datetime(2100, 1, 1, tzinfo=UTC),
                )
            )
    finally:
        engine.dispose()


def stored_secrets(url: str) -> list[str]:
    engine = create_sync_engine(url)
    try:
        with engine.connect() as conn:
            webhooks = Table("webhooks", MetaData(), autoload_with=conn)
            return list(conn.execute(select(webhooks.c.secret).order_by(webhooks.c.id)).scalars())
    finally:
        engine.dispose()


def keyed(tmp_path) -> tuple[Settings, SecretBox]:
    key = Fernet.generate_key().decode()
    return Settings(home=tmp_path, secret_key=key), SecretBox([key])


async def test_upgrade_encrypts_every_plaintext_secret_once(old_database, tmp_path):
    settings, box = keyed(tmp_path)
    migrate(old_database, settings=settings)
    sealed = stored_secrets(old_database)
    assert not any(secret.startswith("whsec_") for secret in sealed)
    assert [box.open(secret) for secret in sealed] == SECRETS

    command.downgrade(alembic_config(old_database, settings), "0004")
    command.upgrade(alembic_config(old_database, settings), "head")
    assert [box.open(secret) for secret in stored_secrets(old_database)] == SECRETS

    engine = create_db_engine(old_database)
    try:
        async with session_factory(engine)() as session:
            (due,) = await take_due(session, 30, 10, team_limit=10)
    finally:
        await engine.dispose()
    assert box.open(due.sealed_secret) == SECRETS[1], "the sender gets what it can open"


def test_without_a_key_setting_the_home_key_is_made_and_used(old_database, tmp_path):
    settings = Settings(home=tmp_path)
    migrate(old_database, settings=settings)
    box = SecretBox([(tmp_path / "secret-key").read_text().strip()])
    assert [box.open(secret) for secret in stored_secrets(old_database)] == SECRETS


def test_downgrade_gives_the_plaintext_back(old_database, tmp_path):
    settings, _ = keyed(tmp_path)
    migrate(old_database, settings=settings)
    command.downgrade(alembic_config(old_database, settings), "0004")
    assert stored_secrets(old_database) == SECRETS
