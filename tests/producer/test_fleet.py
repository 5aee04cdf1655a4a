"""The fleet as `detq workers` shows it: each worker with its model by the file's name."""

from __future__ import annotations

from pathlib import Path

from db.clock import ledger_now
from db.jobs_repo import get_or_create_model
from db.ledger import open_ledger
from db.workers_repo import ROLE_PROCESS, WorkerIdentity, register_worker
from detq.settings import Settings
from producer.fleet import fleet


def test_a_workers_model_is_shown_by_its_files_name(tmp_path: Path) -> None:
    ledger = open_ledger(Settings(_env_file=None, data_dir=tmp_path / "data"))
    try:
        with ledger.sessions() as session, session.begin():
            get_or_create_model(session, sha256="a" * 64, path="/models/detector.pt", size_bytes=1, meta={})
            now = ledger_now(session)
            register_worker(
                session, WorkerIdentity(ROLE_PROCESS, "cpu@h", "h", "h/1", 1, "cpu", "cpu", "a" * 64), now
            )
            register_worker(
                session, WorkerIdentity(ROLE_PROCESS, "cpu@h", "h", "h/2", 2, "cpu", "cpu", "b" * 64), now
            )
        with ledger.reads() as session:
            views = fleet(session, ledger_now(session), timeout_s=60)
        # A model the ledger knows is named by its file; one it does not (its job not recorded here) is not
        assert sorted((v.pid, v.model_name) for v in views) == [(1, "detector.pt"), (2, "")]
    finally:
        ledger.close()
