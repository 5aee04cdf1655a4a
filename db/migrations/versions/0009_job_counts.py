"""Jobs keep how many of their images stand in each state, and their detections, with every write.

`detq status` counted a job's images by status and its detections at every call: 0.2 s at 1,000,000
images on SQLite, and on a PostgreSQL server that never analysed the tables (autovacuum off or late) the
detections alone took seconds at 10,000,000 (issue 43). Six counters on the job row, moved in the
transactions that finish images (their results, a cancel), and a row per producer write in
recorded_counts (what it recorded: a producer must not lock the job row its workers write through), so a
status reads the job's row and a few hundred small ones. The upgrade counts what the ledger holds once,
into the job rows.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # db.models.BigId
STATUSES = ("pending", "done", "failed", "rejected", "cancelled")


def upgrade() -> None:
    """Add jobs.<status>_count and jobs.detection_count, counted from the rows."""
    for status in STATUSES:
        op.add_column(
            "jobs", sa.Column(f"{status}_count", sa.BigInteger(), nullable=False, server_default="0")
        )
        op.execute(
            sa.text(
                f"UPDATE jobs SET {status}_count = (SELECT count(*) FROM images"
                " WHERE images.job_id = jobs.id AND images.status = :status)"
            ).bindparams(status=status)
        )
    op.add_column("jobs", sa.Column("detection_count", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_table(
        "recorded_counts",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", _BIG_ID, nullable=False),
        sa.Column("pending", sa.BigInteger(), nullable=False),
        sa.Column("rejected", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_recorded_counts_job_id", "recorded_counts", ["job_id"])
    op.execute(
        sa.text(
            "UPDATE jobs SET detection_count = (SELECT count(*) FROM detections"
            " JOIN images ON images.id = detections.image_id WHERE images.job_id = jobs.id)"
        )
    )


def downgrade() -> None:
    """Drop them (SQLite 3.35+ drops plain columns in place)."""
    op.drop_index("ix_recorded_counts_job_id", table_name="recorded_counts")
    op.drop_table("recorded_counts")
    op.drop_column("jobs", "detection_count")
    for status in reversed(STATUSES):
        op.drop_column("jobs", f"{status}_count")
