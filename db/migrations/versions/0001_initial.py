"""Initial ledger schema: models, jobs, images, detections.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def big_id() -> sa.types.TypeEngine[int]:
    """db.models.BigId: BIGINT on PostgreSQL, INTEGER on SQLite (which only autoincrements INTEGER keys)."""
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create the four ledger tables and their indexes."""
    op.create_table(
        "models",
        sa.Column("id", big_id(), autoincrement=True, nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sha256", name="uq_models_sha256"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", big_id(), autoincrement=True, nullable=False),
        sa.Column("model_id", big_id(), nullable=False),
        sa.Column("roots", sa.JSON(), nullable=False),
        sa.Column("pool", sa.String(length=8), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("enqueued_complete", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "images",
        sa.Column("id", big_id(), autoincrement=True, nullable=False),
        sa.Column("job_id", big_id(), nullable=False),
        sa.Column("root_index", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("mtime", sa.Float(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("device", sa.String(length=32), nullable=True),
        sa.Column("decode_ms", sa.Float(), nullable=True),
        sa.Column("infer_ms", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "path", name="uq_images_job_path"),
    )
    op.create_index("ix_images_job_status", "images", ["job_id", "status"])
    op.create_table(
        "detections",
        sa.Column("id", big_id(), autoincrement=True, nullable=False),
        sa.Column("image_id", big_id(), nullable=False),
        sa.Column("model_id", big_id(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("label_id", sa.Integer(), nullable=False),
        sa.Column("label", sa.String(length=255), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("x1", sa.Float(), nullable=False),
        sa.Column("y1", sa.Float(), nullable=False),
        sa.Column("x2", sa.Float(), nullable=False),
        sa.Column("y2", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["image_id"], ["images.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("image_id", "model_id", "rank", name="uq_detections_image_model_rank"),
    )


def downgrade() -> None:
    """Drop everything, children first."""
    op.drop_table("detections")
    op.drop_index("ix_images_job_status", table_name="images")
    op.drop_table("images")
    op.drop_table("jobs")
    op.drop_table("models")
