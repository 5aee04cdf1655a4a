"""A live progress line for a running job: done, failed, rate and ETA, redrawn in place on a terminal."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from detq.errors import DetqError
from detq.vocabulary import JobState
from producer.status import JobStatus


class WaitTimeout(DetqError, TimeoutError):
    """The job did not finish within the time given to --wait."""


def format_duration(seconds: float) -> str:
    """Seconds as 1h02m, 3m05s or 42s."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class RateWindow:
    """Images per second over the last `window_s` seconds of samples."""

    def __init__(self, window_s: float = 20.0) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, finished: int) -> float:
        """Record a sample and return the current rate."""
        self.samples.append((now, finished))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        t0, n0 = self.samples[0]
        return (finished - n0) / (now - t0) if now > t0 else 0.0


def render_line(status: JobStatus, rate: float | None, width: int = 28) -> str:
    """One progress line, e.g. [#####-----] 50/100 done 48 failed 1 rejected 1 | 12.5 img/s | ETA 4s.

    Without a rate (a one-off `detq status`), the line ends with the job's state instead.
    """
    finished = status.done + status.failed + status.rejected
    fraction = finished / status.total if status.total else 1.0
    filled = int(round(fraction * width))
    head = (
        f"job {status.job_id} [{'#' * filled}{'-' * (width - filled)}] {finished}/{status.total} "
        f"done {status.done} failed {status.failed} rejected {status.rejected} | "
    )
    if rate is None:
        return head + status.state
    eta = format_duration(status.pending / rate) if rate > 0 and status.pending else "--"
    return head + f"{rate:.1f} img/s | ETA {eta if status.pending else '0s'}"


def wait_with_progress(
    poll: Callable[[], JobStatus],
    *,
    stream: TextIO = sys.stderr,
    interval_s: float = 0.5,
    timeout_s: float | None = None,
) -> JobStatus:
    """Poll until the job finishes, redrawing a progress line (or one line per 5 s off a terminal)."""
    tty = stream.isatty()
    window = RateWindow()
    started = time.monotonic()
    last_print = 0.0
    while True:
        status = poll()
        now = time.monotonic()
        rate = window.add(now, status.done + status.failed + status.rejected)
        line = render_line(status, rate)
        done = status.state == JobState.FINISHED
        if tty:
            stream.write("\r\x1b[2K" + line + ("\n" if done else ""))
            stream.flush()
        elif done or now - last_print >= 5.0:
            stream.write(line + "\n")
            stream.flush()
            last_print = now
        if done:
            return status
        if timeout_s is not None and now - started > timeout_s:
            raise WaitTimeout(f"job {status.job_id} not finished after {timeout_s:.0f} s")
        time.sleep(interval_s)
