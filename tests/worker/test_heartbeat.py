"""A pool process's heartbeat: after beats it could not write (the ledger away), it takes no other
process's missing beats for a death until its own have been written for a whole timeout."""

from __future__ import annotations

import time
from pathlib import Path

from db.ledger import open_ledger
from db.workers_repo import ROLE_PROCESS, Beat, WorkerIdentity
from detq.settings import Settings
from tests.integration.faults import wait_until
from worker.heartbeat import Heartbeat


def test_liveness_is_judged_only_once_beats_have_been_written_for_a_timeout(tmp_path: Path) -> None:
    ledger = open_ledger(Settings(_env_file=None, data_dir=tmp_path / "data"))
    identity = WorkerIdentity(ROLE_PROCESS, "cpu@h", "h", "h/1", 1, "cpu", "cpu", "f" * 64)
    heart = Heartbeat(ledger.sessions, identity, interval_s=0.05, state=Beat)
    heart.start()
    failing = {"on": False}
    real = heart.beat_now

    def beat_now(payload: Beat | None = None) -> None:
        if failing["on"]:
            raise OSError(28, "No space left on device")
        real(payload)

    heart.beat_now = beat_now  # type: ignore[method-assign]
    try:
        # Given a process whose beats have always been written: it judges others at once
        assert heart.judges_liveness(30)
        # When its beats fail (the ledger away)
        failing["on"] = True
        wait_until(lambda: not heart.judges_liveness(0), 5, "a failed beat noticed")
        # Then it judges nobody, and once they are written again, only after a whole timeout
        failing["on"] = False
        wait_until(lambda: heart.judges_liveness(0), 5, "a beat written again")
        assert not heart.judges_liveness(30)
        time.sleep(0.3)
        assert heart.judges_liveness(0.25)
    finally:
        heart.stop()
        ledger.close()
