"""A worker node falling idle: every pool process busy, then one free for a moment (a queue's tail)."""

from __future__ import annotations

import time
from collections.abc import Callable

# How often the node's reconciler loop looks (in memory) whether a process came free, and how long one
# must stay free to count: between two batches of a busy queue a process is free for milliseconds.
IDLE_POLL_S = 0.05
IDLE_SETTLE_S = 0.1


class IdleWatch:
    """Fires once each time a node whose pool processes were all busy has had one free for settle_s.

    The node then says so at once (announce: a heartbeat now, so the ledger shows it free) and looks for
    batches at its queue's tail that a slower node holds (dispatch/tail.py), instead of leaving both to
    the next heartbeat and the lease holder's next tail pass, about half a second later.
    """

    def __init__(
        self,
        free: Callable[[], int],
        announce: Callable[[], None],
        settle_s: float = IDLE_SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._free = free
        self.announce = announce
        self.settle_s = settle_s
        self._clock = clock
        self._was_busy = False
        self._free_since: float | None = None

    def fell_idle(self) -> bool:
        """Whether the node fell idle since the last call that said so (read now)."""
        if self._free() <= 0:
            self._was_busy, self._free_since = True, None
            return False
        now = self._clock()
        if self._free_since is None:
            self._free_since = now
        if self._was_busy and now - self._free_since >= self.settle_s:
            self._was_busy = False
            return True
        return False
