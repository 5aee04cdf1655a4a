"""Self-healing ledger: batches, worker heartbeats, image claims, producer heartbeat and closing reason.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _image_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("batch_id", sa.BigInteger(), nullable=True),
        sa.Column("claimed_by", sa.BigInteger(), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
    ]


def _job_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("enqueue_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_reason", sa.Text(), nullable=True),
    ]


def upgrade() -> None:
    """Nullable columns only (no table rewrite), two new tables and their indexes."""
    for column in _image_columns():
        op.add_column("images", column)
    op.create_index("ix_images_batch", "images", ["batch_id"])
    for column in _job_columns():
        op.add_column("jobs", column)
    op.create_table(
        "batches",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", _BIG_ID, nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sends", sa.Integer(), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("missing_since", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_batches_job_id", "batches", ["job_id"])
    op.create_table(
        "workers",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("host_key", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(length=8), nullable=False),
        sa.Column("device", sa.String(length=32), nullable=True),
        sa.Column("model_sha256", sa.String(length=64), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stop_reason", sa.String(length=32), nullable=True),
        sa.Column("current_batch_id", sa.BigInteger(), nullable=True),
        sa.Column("held", sa.JSON(), nullable=False),
        sa.Column("batches_done", sa.Integer(), nullable=False),
        sa.Column("images_done", sa.Integer(), nullable=False),
        sa.Column("images_per_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_workers_alive", "workers", ["stopped_at", "last_seen_at"])


def downgrade() -> None:
    """Drop what upgrade added."""
    op.drop_index("ix_workers_alive", table_name="workers")
    op.drop_table("workers")
    op.drop_index("ix_batches_job_id", table_name="batches")
    op.drop_table("batches")
    for column in reversed(_job_columns()):
        op.drop_column("jobs", column.name)
    op.drop_index("ix_images_batch", table_name="images")
    for column in reversed(_image_columns()):
        op.drop_column("images", column.name)
