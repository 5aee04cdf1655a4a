"""Keep a job's enqueue marked alive while its producer scans, so the reconciler can tell a dead one."""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from sqlalchemy.orm import Session, sessionmaker

from db.clock import ledger_now
from db.enqueue_repo import touch_enqueue
from db.retry import in_transaction

log = logging.getLogger(__name__)


class EnqueueWatch:
    """`with EnqueueWatch(...)`: a daemon thread renews jobs.enqueue_seen_at every interval_s, by the
    database's clock (db.clock.ledger_now: the reconciler judges it by the same clock).

    Whether the job is still open is asked where it matters, in each chunk's transaction
    (db.enqueue_repo.lock_open_enqueue).
    """

    def __init__(self, sessions: sessionmaker[Session], job_id: int, interval_s: float) -> None:
        self.sessions = sessions
        self.job_id = job_id
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"detq-enqueue-{job_id}", daemon=True)

    def touch(self) -> None:
        """Renew now (a closed job is left as it is)."""
        in_transaction(self.sessions, lambda s: touch_enqueue(s, self.job_id, ledger_now(s)))

    def __enter__(self) -> EnqueueWatch:
        # No touch here: the job was stamped alive when it was made (producer/new_job.py).
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.touch()
            except Exception:  # noqa: BLE001 - a missed renewal is retried; the scan itself goes on
                log.warning("detq enqueue: job %d: could not renew its heartbeat", self.job_id, exc_info=True)
