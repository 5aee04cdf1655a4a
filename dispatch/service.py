"""The reconciler loop: in every worker and scheduler, one of them (by lease) reconciles every few seconds."""

from __future__ import annotations

import logging
import threading
import time

from db.engine import is_transient_error
from db.ledger import Ledger, open_ledger
from detq.celery_app import make_celery_app
from detq.settings import Settings
from dispatch.broker import READ_LIMIT
from dispatch.idle import IDLE_POLL_S, IdleWatch
from dispatch.leadership import RECONCILER_LEASE, Leadership
from dispatch.reconcile import reconcile
from dispatch.tail import tail_pass

log = logging.getLogger(__name__)

# How often nodes report a change of what they hold, and the lease holder looks for idle workers at a
# queue's tail (dispatch/backups.py), between its full passes.
TAIL_WATCH_S = 0.5


class ReconcilerLoop:
    """A daemon thread that runs a reconciler pass each interval while this process holds the lease.

    Every `detq worker` and `detq scheduler` runs one, so a single machine heals itself; the lease makes
    one of them act at a time, and a standby takes over within about three intervals of the holder's end.
    A worker node's loop also looks for backups itself, lease or not, when its own pool falls idle.
    """

    def __init__(self, settings: Settings, idle: IdleWatch | None = None) -> None:
        """idle: a worker node's watch of its pool falling idle; then it looks for backups itself."""
        self.settings = settings
        self.idle = idle
        self.ledger: Ledger | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="detq-reconciler", daemon=True)
        self._leadership: Leadership | None = None

    def start(self) -> None:
        """Open this loop's own ledger and broker connection and start the thread."""
        self.ledger = open_ledger(self.settings, check_schema=False, kept=1)  # one thread: one connection
        self._leadership = Leadership(
            self.ledger.sessions, ttl_s=self.settings.reconcile_interval_s * 3, name=RECONCILER_LEASE
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, give the lease back, close the connections."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.settings.reconcile_interval_s + 5)
        if self._leadership is not None:
            self._leadership.release()
        if self.ledger is not None:
            self.ledger.close()

    def _wait_s(self, next_tail: float) -> float:
        """Until the next tail pass is due; no longer than the next look at the node's pool, if watched."""
        left = max(0.0, next_tail - time.monotonic())
        return left if self.idle is None else min(IDLE_POLL_S, left)

    def _run(self) -> None:
        assert self.ledger is not None and self._leadership is not None
        app = make_celery_app(self.settings)
        # Nobody could beat while the database was away: a worker is only judged once it has been
        # reachable for a whole DETQ_WORKER_TIMEOUT, or every worker would look dead after an outage.
        reachable_since: float | None = None
        held = False
        tail_every = min(TAIL_WATCH_S, self.settings.reconcile_interval_s)
        next_tail = time.monotonic() + tail_every
        next_pass = time.monotonic() + self.settings.reconcile_interval_s
        try:
            while not self._stop.wait(self._wait_s(next_tail)):
                try:
                    if self.idle is not None and self.idle.fell_idle() and self.settings.backups:
                        # Lease or not: claim_send keeps this and the holder's pass to one copy.
                        log.debug("detq: the pool fell idle; looking for backups at its queue's tail")
                        self.idle.announce()
                        tail_pass(self.ledger, app, self.settings)
                    if time.monotonic() < next_tail:
                        continue
                    next_tail = time.monotonic() + tail_every
                    if time.monotonic() < next_pass:
                        if held and self.settings.backups:
                            tail_pass(self.ledger, app, self.settings)
                        continue
                    next_pass = time.monotonic() + self.settings.reconcile_interval_s
                    held = self._leadership.check()
                    if not self._leadership.reachable:
                        reachable_since = None
                        continue
                    reachable_since = reachable_since or time.monotonic()
                    if held and time.monotonic() - reachable_since >= self.settings.worker_timeout:
                        reconcile(self.ledger, app, self.settings, read_limit=READ_LIMIT)
                except Exception as exc:  # noqa: BLE001 - a failed pass (broker or database away) is retried
                    if is_transient_error(exc):
                        reachable_since = None
                        held = False
                    log.warning("detq reconciler: pass failed; trying again", exc_info=True)
        finally:
            app.close()
