"""Scheduled runs: run key and incremental counts on jobs, schedule state, scheduler lease, images by path.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _job_columns() -> list[sa.Column[object]]:
    """The columns added to jobs, fresh objects on each call (a Column belongs to one table)."""
    return [
        sa.Column("schedule_name", sa.String(length=255), nullable=True),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=True),
        sa.Column("new_images", sa.Integer(), nullable=True),
        sa.Column("changed_images", sa.Integer(), nullable=True),
        sa.Column("retried_images", sa.Integer(), nullable=True),
        sa.Column("skipped_images", sa.Integer(), nullable=True),
    ]


def upgrade() -> None:
    """Add the nullable job columns (no table rewrite on either database), the new tables and indexes."""
    for column in _job_columns():
        op.add_column("jobs", column)
    op.create_index("uq_jobs_schedule_run", "jobs", ["schedule_name", "scheduled_for"], unique=True)
    op.create_index("ix_images_path", "images", ["path"])
    op.create_table(
        "schedule_state",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_scheduled_for", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "scheduler_leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    """Drop what upgrade added; SQLite (3.35+) drops the plain columns in place, without a table copy."""
    op.drop_table("scheduler_leases")
    op.drop_table("schedule_state")
    op.drop_index("ix_images_path", table_name="images")
    op.drop_index("uq_jobs_schedule_run", table_name="jobs")
    for column in reversed(_job_columns()):
        op.drop_column("jobs", column.name)
