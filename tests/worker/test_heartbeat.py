"""A pool process's heartbeat: after beats it could not write (the ledger away), it takes no other
process's missing beats for a death until its own have been written for a whole timeout."""

from __future__ import annotations

import time
from pathlib import Path

from db.ledger import open_ledger
from db.workers_repo import ROLE_PROCESS, Beat, WorkerIdentity
from detq.settings import Settings
from tests.integration.faults import wait_until
from worker.heartbeat import Heartbeat, ProcessStats


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


def test_a_process_rate_is_over_the_time_it_has_worked_not_a_whole_minute() -> None:
    stats = ProcessStats()
    # A process that began its first batch at t=100 and has finished 16 images 4 s later does 4 a second
    stats.start(1, now=100.0)
    stats.add(8, now=102.0)
    stats.start(2, now=102.0)
    stats.add(8, now=104.0)
    assert stats.images_per_s(now=104.0) == 4.0
    # Idle after, the rate falls (16 images over the 10 s since they began), then ends with the minute
    assert stats.images_per_s(now=110.0) == 1.6
    assert stats.images_per_s(now=170.0) == 0.0
    # Working for longer than the window: the images of the last minute over that minute
    busy = ProcessStats()
    for second in range(0, 120, 2):
        busy.start(second, now=float(second))
        busy.add(8, now=float(second + 2))
    assert busy.images_per_s(now=120.0) == 4.0
