"""Jobs record the inference settings their results were made with, and a key of them.

A threshold changed between two runs over one folder was "nothing new": the incremental key was the
model's sha256 alone (issue 40). Two nullable columns, added in place on both databases. Jobs made
before are given the key of the default settings (the digest of {}, detq.inference_settings), so an
upgraded ledger's incremental runs at the defaults find their earlier results; their settings stay NULL
(not known: they ran as their workers' settings said).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# detq.inference_settings.DEFAULT_KEY as it is at this revision: sha256("{}") in 16 hex digits.
DEFAULT_KEY = "44136fa355b3678a"


def upgrade() -> None:
    """Add jobs.settings and jobs.settings_key; earlier jobs take the defaults' key."""
    op.add_column("jobs", sa.Column("settings", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("settings_key", sa.String(16), nullable=True))
    op.execute(sa.text("UPDATE jobs SET settings_key = :key").bindparams(key=DEFAULT_KEY))


def downgrade() -> None:
    """Drop them (SQLite 3.35+ drops plain columns in place)."""
    op.drop_column("jobs", "settings_key")
    op.drop_column("jobs", "settings")
