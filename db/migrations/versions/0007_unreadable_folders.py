"""Jobs say which folders their scan could not list: how many, and the first ones with their reasons.

A folder whose listing fails (permission denied, gone, a path past PATH_MAX) holds images that are in no
job; the producer told no one until the twenty-third session. Two nullable columns, added in place on
both databases (no table rewrite).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add jobs.unreadable_count and jobs.unreadable_folders."""
    op.add_column("jobs", sa.Column("unreadable_count", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("unreadable_folders", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop them (SQLite 3.35+ drops plain columns in place)."""
    op.drop_column("jobs", "unreadable_folders")
    op.drop_column("jobs", "unreadable_count")
