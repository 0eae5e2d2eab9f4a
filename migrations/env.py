"""Alembic environment: one migration history for SQLite and Postgres.

The URL comes from `migrate(database_url)` (config attribute) or, for the `alembic`
command, from the service settings. SQLite runs in batch mode so ALTERs work there.
"""

from logging.config import fileConfig

from alembic import context
from sqlalchemy import text

from app.core.config import get_settings
from app.core.db import create_sync_engine
from app.tables import METADATA

LOCK_KEY = 7_340_001  # any constant: names this project's migration lock in Postgres
config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

database_url = config.attributes.get("database_url") or get_settings().database_url
engine = create_sync_engine(database_url)
try:
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=METADATA,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                # Processes starting together (API replicas, workers) migrate one at a time;
                # the later ones find the schema current. Held until the transaction ends.
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
            context.run_migrations()
finally:
    engine.dispose()
