"""Webhook signing secrets encrypted at rest: every plaintext secret (`whsec_...`) becomes a
Fernet token under the service's first key (OPD_SECRET_KEY, else <home>/secret-key), in a
column wide enough for one. Rows already encrypted are left as they are, so running it
again changes nothing. The downgrade decrypts them back.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from app.core.config import get_settings
from app.core.encryption import SecretBox, secret_box

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WEBHOOKS = sa.table("webhooks", sa.column("id", sa.Integer), sa.column("secret", sa.Text))
PLAIN = WEBHOOKS.c.secret.like("whsec\\_%", escape="\\")
"""A secret as new_secret() makes it; a Fernet token starts `gAAAAA`."""


def box() -> SecretBox:
    """The keys of the service being migrated (`migrate(..., settings=)`), else this
    process's settings (the `alembic` command)."""
    return secret_box(context.config.attributes.get("settings") or get_settings())


def rewrite(where: sa.ColumnElement[bool], change: str) -> None:
    """Each secret `where` selects, passed through the box's `change` (seal or open); the
    keys are read only when there is a row to rewrite."""
    bind = op.get_bind()
    rows = bind.execute(sa.select(WEBHOOKS.c.id, WEBHOOKS.c.secret).where(where)).all()
    if not rows:
        return
    convert = getattr(box(), change)
    for webhook_id, secret in rows:
        bind.execute(
            WEBHOOKS.update().where(WEBHOOKS.c.id == webhook_id).values(secret=convert(secret))
        )


def upgrade() -> None:
    with op.batch_alter_table("webhooks") as webhooks:
        webhooks.alter_column("secret", existing_type=sa.String(100), type_=sa.Text())
    rewrite(PLAIN, "seal")


def downgrade() -> None:
    rewrite(~PLAIN, "open")
    with op.batch_alter_table("webhooks") as webhooks:
        webhooks.alter_column("secret", existing_type=sa.Text(), type_=sa.String(100))
