"""A pool process's free heap handed back to the system once it has idled a while, from a daemon thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

IDLE_S = 30.0  # far longer than the gap between a job's batches (tens of ms)
CHECK_S = 5.0


class IdleTrim:
    """Calls give_back once per idle spell: when the process last finished a batch at least idle_s ago
    and runs none now. While it works its heap stays as large as its largest photo needed
    (worker/allocator.py)."""

    def __init__(
        self,
        idle_since: Callable[[], float | None],
        give_back: Callable[[], object],
        *,
        idle_s: float = IDLE_S,
        check_s: float = CHECK_S,
    ) -> None:
        """idle_since: the monotonic time the last batch ended, None while one runs or before the first."""
        self.idle_since = idle_since
        self.give_back = give_back
        self.idle_s = idle_s
        self.check_s = check_s
        self._given_back_after: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="detq-idle-trim", daemon=True)

    def tick(self, now: float) -> bool:
        """Give the free heap back if the process has idled idle_s since its last batch and has not done
        so in this idle spell; whether it did."""
        since = self.idle_since()
        if since is None or since == self._given_back_after or now - since < self.idle_s:
            return False
        self._given_back_after = since
        self.give_back()
        return True

    def start(self) -> None:
        """Check every check_s from a daemon thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop checking; waits for the thread."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.check_s + 1)

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                if self.tick(time.monotonic()):
                    log.debug("detq: idle for %.0f s, free heap given back", self.idle_s)
            except Exception:  # noqa: BLE001 - never worth a pool process
                log.warning("detq: could not give back free memory", exc_info=True)
