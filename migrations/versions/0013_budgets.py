"""Team budgets: `team_budgets` (one row per team that has one) and `team_spend_days`
(a team's tokens per UTC day by the models they are priced at, what a budget adds up),
filled from `usage_days` so the period under way counts what was already used.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from kernel.spec.teachers import priced_teacher

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTERS = ("sampled_tokens", "teacher_tokens", "trained_tokens", "eval_tokens")


def upgrade() -> None:
    op.create_table(
        "team_budgets",
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("cost", sa.Float(), nullable=True),
        sa.Column("soft", sa.Float(), nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("warned_for", sa.Date(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_team_budgets_team_id_teams")
        ),
        sa.PrimaryKeyConstraint("team_id", name=op.f("pk_team_budgets")),
    )
    spend = op.create_table(
        "team_spend_days",
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("student", sa.Text(), nullable=False),
        sa.Column("teacher", sa.Text(), nullable=False),
        *(sa.Column(column, sa.BigInteger(), nullable=False) for column in COUNTERS),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_team_spend_days_team_id_teams")
        ),
        sa.PrimaryKeyConstraint(
            "team_id", "day", "backend", "student", "teacher", name=op.f("pk_team_spend_days")
        ),
    )
    op.bulk_insert(spend, spend_rows())


def spend_rows() -> list[dict[str, Any]]:
    """`usage_days` added up by team, day and the models each job is priced at."""
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id"), sa.column("spec"))
    usage = sa.table(
        "usage_days", sa.column("job_id"), sa.column("day"), sa.column("team_id"),
        *(sa.column(column) for column in COUNTERS),
    )  # fmt: skip
    sums: dict[tuple[Any, ...], Counter[str]] = {}
    rows = bind.execute(
        sa.select(usage, jobs.c.spec).join(jobs, jobs.c.id == usage.c.job_id)
    ).mappings()
    for row in rows:
        spec = row["spec"] if isinstance(row["spec"], dict) else json.loads(row["spec"])
        teacher = priced_teacher(spec["teacher"]["base_model"], spec.get("teachers"))
        key = (row["team_id"], row["day"], spec["backend"], spec["student"]["base_model"], teacher)
        sums.setdefault(key, Counter()).update({column: row[column] for column in COUNTERS})
    names = ("team_id", "day", "backend", "student", "teacher")
    return [
        dict(zip(names, key, strict=True)) | {column: counts[column] for column in COUNTERS}
        for key, counts in sums.items()
    ]


def downgrade() -> None:
    op.drop_table("team_spend_days")
    op.drop_table("team_budgets")
