"""Detections without foreign keys: PostgreSQL checked both for every box written.

Detections are written only by finalise_results, for images it holds locked in the same transaction,
and deleted with their job by delete_job; the per-row checks (a lookup and a lock of the parent row for
each key) took two thirds of a batch's COPY. PostgreSQL drops the constraints in place; SQLite cannot,
so batch mode rebuilds the table (one copy of its rows, once).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The names PostgreSQL gave the constraints of 0001; SQLite's are unnamed, so batch mode names them by
# this convention to find them.
IMAGE_FK = "detections_image_id_fkey"
MODEL_FK = "detections_model_id_fkey"
NAMING = {"fk": "%(table_name)s_%(column_0_name)s_fkey"}


def _is_sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def upgrade() -> None:
    """Drop the two foreign keys of detections."""
    if _is_sqlite():
        with op.batch_alter_table("detections", naming_convention=NAMING, recreate="always") as batch:
            batch.drop_constraint(IMAGE_FK, type_="foreignkey")
            batch.drop_constraint(MODEL_FK, type_="foreignkey")
        return
    op.drop_constraint(IMAGE_FK, "detections", type_="foreignkey")
    op.drop_constraint(MODEL_FK, "detections", type_="foreignkey")


def downgrade() -> None:
    """Put them back (PostgreSQL validates every existing row)."""
    with op.batch_alter_table("detections", naming_convention=NAMING) as batch:
        batch.create_foreign_key(IMAGE_FK, "images", ["image_id"], ["id"], ondelete="CASCADE")
        batch.create_foreign_key(MODEL_FK, "models", ["model_id"], ["id"])
