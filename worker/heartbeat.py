"""Worker heartbeats: a row per node and per pool process, refreshed from a daemon thread, closed on exit."""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from db.clock import LedgerClock
from db.models import WorkerRecord
from db.retry import in_transaction
from db.workers_repo import STOPPED, Beat, WorkerIdentity, beat, close_worker, register_worker

log = logging.getLogger(__name__)

RATE_WINDOW_S = 60.0


@functools.cache
def host_key() -> str:
    """Where this process's pid means something: the host name and, on Linux, its pid namespace."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # pragma: no cover - no procfs
        return socket.gethostname()
    return f"{socket.gethostname()}/{namespace}"


def pid_running(pid: int) -> bool:
    """True while a process of this pid exists here."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def still_running(record: WorkerRecord) -> bool:
    """False only when the worker is known dead: on this host (same pid namespace), its pid is gone."""
    return record.host_key != host_key() or pid_running(record.pid)


@dataclass
class ProcessStats:
    """What a pool process has done, for its heartbeat (batches, images, images/s over a minute) and its
    idle trim (when it last finished a batch)."""

    batches_done: int = 0
    images_done: int = 0
    current_batch_id: int | None = None
    last_ended: float | None = None  # monotonic time the last batch ended
    began: float | None = None  # monotonic time the batch in hand began
    _recent: deque[tuple[float, float, int]] = field(default_factory=deque)  # (began, ended, images)

    def start(self, batch_id: int | None, now: float | None = None) -> None:
        """A batch begins (its id, where it has one)."""
        self.current_batch_id = batch_id
        self.began = time.monotonic() if now is None else now

    def add(self, images: int, now: float | None = None) -> None:
        """A batch ended with this many images brought to a terminal state."""
        moment = time.monotonic() if now is None else now
        self.batches_done += 1
        self.images_done += images
        self._recent.append((moment if self.began is None else self.began, moment, images))
        self.last_ended = moment
        self.began = None

    def idle_since(self) -> float | None:
        """When the last batch ended; None while a batch runs or before the first."""
        return None if self.current_batch_id is not None else self.last_ended

    def images_per_s(self, now: float | None = None) -> float:
        """Images of the batches finished in the last minute, per second since the first of them began: a
        process started 4 s ago that has done 16 images does 4 a second, not 16 over a minute's 60 s."""
        moment = time.monotonic() if now is None else now
        while self._recent and moment - self._recent[0][1] > RATE_WINDOW_S:
            self._recent.popleft()
        if not self._recent:
            return 0.0
        span = moment - self._recent[0][0]
        return round(sum(n for _, _, n in self._recent) / max(span, 1e-3), 3)

    def beat(self) -> Beat:
        """The heartbeat's payload."""
        return Beat(
            current_batch_id=self.current_batch_id,
            batches_done=self.batches_done,
            images_done=self.images_done,
            images_per_s=self.images_per_s(),
        )


class Heartbeat:
    """A worker row kept alive from a daemon thread every interval; closed (stopped) by stop()."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        identity: WorkerIdentity,
        *,
        interval_s: float,
        state: Callable[[], Beat],
        watch_s: float | None = None,
        clock: LedgerClock | None = None,
    ) -> None:
        """watch_s: also read state() this often, and beat at once when its held task ids change (a node
        that falls idle says so within watch_s, not a whole interval later)."""
        self.sessions = sessions
        self.identity = identity
        self.interval_s = interval_s
        self.watch_s = min(watch_s, interval_s) if watch_s else interval_s
        self.state = state
        self.worker_id = 0
        # The time this process stamps, measured against the database server's at each beat: other
        # machines judge it by that clock, and this one's may be off or drift.
        self.clock = clock or LedgerClock()
        # Since when (monotonic) its beats have been written without one failing: the ledger was
        # reachable, so other processes' beats could be written too. Before the first failure, as if always.
        self._written_since: float | None = float("-inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"detq-heartbeat-{identity.role}", daemon=True)

    def start(self) -> int:
        """Register the row and start beating; returns the row's id."""
        self.worker_id = in_transaction(self.sessions, self._register)
        self._thread.start()
        return self.worker_id

    def beat_now(self, payload: Beat | None = None) -> None:
        """One heartbeat, now (of payload, or of state() read now)."""
        payload = payload or self.state()

        def refresh(session: Session) -> None:
            self.clock.measure(session)
            beat(session, self.worker_id, self.clock.now(), payload)

        in_transaction(self.sessions, refresh, give_up_after_s=5)

    def _register(self, session: Session) -> int:
        self.clock.measure(session)
        return register_worker(session, self.identity, self.clock.now())

    def stop(self, reason: str = STOPPED) -> None:
        """Stop beating and close the row (a clean exit)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval_s + 5)
        try:
            in_transaction(
                self.sessions,
                lambda s: close_worker(s, [self.worker_id], self.clock.now(), reason),
                give_up_after_s=5,
            )
        except Exception:  # noqa: BLE001 - the row then ends as lost, found by the reconciler
            log.warning("detq: could not close worker row %d", self.worker_id, exc_info=True)

    def _run(self) -> None:
        last_beat = time.monotonic()
        last_held: list[str] | None = None
        while not self._stop.wait(self.watch_s):
            payload = self.state()
            held = list(payload.held) if payload.held is not None else None
            if held == last_held and time.monotonic() - last_beat < self.interval_s - self.watch_s / 2:
                continue
            try:
                self.beat_now(payload)
                last_beat, last_held = time.monotonic(), held
                if self._written_since is None:
                    self._written_since = last_beat
            except Exception:  # noqa: BLE001 - a missed beat (database away) is retried next interval
                self._written_since = None
                log.warning("detq: heartbeat of worker %d failed", self.worker_id, exc_info=True)

    def judges_liveness(self, timeout_s: float) -> bool:
        """Whether this process may take another's missing beats for its death: its own beats have been
        written for timeout_s (after an outage of the ledger, a full disk, nobody's could be; every worker
        would look dead at once)."""
        since = self._written_since
        return since is not None and time.monotonic() - since >= timeout_s
