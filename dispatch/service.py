"""The reconciler loop: in every worker and scheduler, one of them (by lease) reconciles every few seconds."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from celery import Celery

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

    def _run(self) -> None:
        """Wake at the tail watch's period (or the idle watch's, if shorter) and take what is due."""
        app = make_celery_app(self.settings)
        steps = _Steps(
            tail=_Every(min(TAIL_WATCH_S, self.settings.reconcile_interval_s)),
            full=_Every(self.settings.reconcile_interval_s),
        )
        try:
            while not self._stop.wait(self._wait_s(steps.tail)):
                try:
                    self._step(app, steps)
                except Exception as exc:  # noqa: BLE001 - a failed pass (broker or database away) is retried
                    if is_transient_error(exc):
                        steps.reachable_since = None
                        steps.held = False
                    log.warning("detq reconciler: pass failed; trying again", exc_info=True)
        finally:
            app.close()

    def _wait_s(self, tail: _Every) -> float:
        """Until the next tail pass is due; no longer than the next look at the node's pool, if watched."""
        return tail.left_s() if self.idle is None else min(IDLE_POLL_S, tail.left_s())

    def _step(self, app: Celery, steps: _Steps) -> None:
        """One wake-up, three things on their own clocks:

        1. this node's pool just fell idle: look for backups at its queue's tail, lease or not (claim_send
           keeps this and the holder's pass to one copy);
        2. the tail watch's period (TAIL_WATCH_S): the lease holder looks for backups;
        3. the full period (a third of DETQ_WORKER_TIMEOUT): the lease is checked or taken, and its holder
           runs a reconciler pass, once the database has been reachable for a whole DETQ_WORKER_TIMEOUT
           (nobody could beat while it was away, and every worker would look dead after an outage).
        """
        assert self.ledger is not None and self._leadership is not None
        if self.idle is not None and self.idle.fell_idle() and self.settings.backups:
            log.debug("detq: the pool fell idle; looking for backups at its queue's tail")
            self.idle.announce()
            tail_pass(self.ledger, app, self.settings)
        if not steps.tail.due():
            return
        if not steps.full.due():
            if steps.held and self.settings.backups:
                tail_pass(self.ledger, app, self.settings)
            return
        steps.held = self._leadership.check()
        if not self._leadership.reachable:
            steps.reachable_since = None
            return
        steps.reachable_since = steps.reachable_since or time.monotonic()
        if steps.held and time.monotonic() - steps.reachable_since >= self.settings.worker_timeout:
            reconcile(self.ledger, app, self.settings, read_limit=READ_LIMIT)


class _Every:
    """A period and when it is next due, by the monotonic clock."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.next_at = time.monotonic() + period_s

    def due(self) -> bool:
        """True once the period has run out, and it starts again from now."""
        now = time.monotonic()
        if now < self.next_at:
            return False
        self.next_at = now + self.period_s
        return True

    def left_s(self) -> float:
        """Seconds until it is due."""
        return max(0.0, self.next_at - time.monotonic())


@dataclass
class _Steps:
    """The loop's clocks, and what its last full period found."""

    tail: _Every
    full: _Every
    held: bool = False  # this process holds the reconciler's lease
    reachable_since: float | None = None  # the database answered the lease check since (monotonic)
