"""Following a running job: a progress line that fits the terminal, hints, and the closing summary."""

from __future__ import annotations

import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from types import TracebackType
from typing import TextIO

from detq.display import visible
from detq.errors import DetqError
from detq.vocabulary import JobState
from producer.status import JobStatus

# `--wait` and `detq run` exit codes beside 0 (all done), 1 (error), 2 (usage) and 3 (worker start-up).
EXIT_FINISHED_WITH_FAILURES = 4
EXIT_TIMED_OUT = 5
PLAIN_LINE_EVERY_S = 5.0
# The share of a wait spent polling, at most: a poll of a job of 100,000 images takes ~13 ms of
# PostgreSQL's time, of 1,000,000 ~70 ms, which a 0.5 s interval would make 14% of a core per waiter.
POLL_SHARE = 0.05
MAX_BAR = 30


class WaitTimeout(DetqError, TimeoutError):
    """The job did not finish within the time given to --wait."""

    exit_code = EXIT_TIMED_OUT


def format_duration(seconds: float, *, tenths: bool = False) -> str:
    """Seconds as 1h02m, 3m05s or 42s; with tenths, under 10 s as 0.4s or 4.2s (a time taken, where an
    estimate keeps whole seconds)."""
    if tenths and seconds < 9.95:
        return f"{max(0.0, seconds):.1f}s"
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


def render_line(status: JobStatus, rate: float | None, columns: int = 100) -> str:
    """One progress line within `columns`, e.g.
    job 7 [#####-----] 50/100 done 48 failed 1 rejected 1 | 12.5 img/s | ETA 4s

    The bar takes what room is left (none on a narrow terminal); the counts come in a shorter form when
    even that does not fit. Without a rate (a one-off `detq status`), the line ends with the job's state.
    """
    finished = status.total - status.pending
    if rate is None:
        tail = str(status.state)
    else:
        eta = format_duration(status.pending / rate) if rate > 0 and status.pending else "--"
        tail = f"{rate:.1f} img/s | ETA {eta if status.pending else '0s'}"
    counts = f"{finished}/{status.total} done {status.done} failed {status.failed} rejected {status.rejected}"
    text = f"job {status.job_id} {counts} | {tail}"
    room = min(MAX_BAR, columns - len(text) - 3)
    if room >= 5:
        fraction = finished / status.total if status.total else 1.0
        filled = int(round(fraction * room))
        return f"job {status.job_id} [{'#' * filled}{'-' * (room - filled)}] {counts} | {tail}"
    if len(text) <= columns:
        return text
    short = f"job {status.job_id} {finished}/{status.total} f{status.failed} r{status.rejected} | {tail}"
    return short[:columns]


class _LiveLine:
    """A progress line redrawn in place on a terminal (rich), with other lines printed above it.

    rich is imported here, not with the module: `detq enqueue` imports this module, and rich's import
    (about 30 ms of CPU) would delay its first task even when it does not wait; off a terminal (a pipe,
    a log, the bench) a wait prints plain lines and never imports it, so that CPU is not taken from the
    workers beside it.
    """

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=stream, highlight=False)
        self.live = Live(console=self.console, auto_refresh=False, transient=True)

    @property
    def width(self) -> int:
        """The terminal's columns."""
        return self.console.width

    def show(self, line: str) -> None:
        """Redraw the progress line."""
        from rich.text import Text

        self.live.update(Text(line, no_wrap=True, overflow="ellipsis"), refresh=True)

    def say(self, line: str) -> None:
        """A line that stays, above the progress line."""
        self.console.print(line, soft_wrap=True, highlight=False, markup=False)

    def stop(self) -> None:
        """Take the progress line off the screen."""
        self.live.stop()

    def __enter__(self) -> _LiveLine:
        self.live.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.live.stop()


def wait_with_progress(
    poll: Callable[[], JobStatus],
    *,
    stream: TextIO = sys.stderr,
    interval_s: float = 0.5,
    timeout_s: float | None = None,
    hint: Callable[[], str | None] | None = None,
    hint_every_s: float = 5.0,
) -> JobStatus:
    """Poll until the job finishes: a live line on a terminal, one plain line per 5 s elsewhere.

    Polls every interval_s, or less often when a poll takes long (a job of millions of images): at most
    POLL_SHARE of the time goes into polling, so a waiting command never keeps the database busy.
    `hint` (asked every hint_every_s) may say why nothing moves, e.g. that no worker listens; each new
    hint is printed once, on its own line.
    """
    window = RateWindow()
    started = time.monotonic()
    last_plain = last_hint_check = -1e9
    shown_hint: str | None = None
    live = _LiveLine(stream) if stream.isatty() else None
    plain_columns = shutil.get_terminal_size().columns if live is None else 0  # read once, not per poll

    def say(line: str, *, progress: bool) -> None:
        if live is None:
            print(line, file=stream, flush=True)
        elif progress:
            live.show(line)
        else:
            live.say(line)

    with live if live is not None else nullcontext():
        while True:
            began = time.monotonic()
            status = poll()
            now = time.monotonic()
            pause = max(interval_s, (now - began) * (1 - POLL_SHARE) / POLL_SHARE)
            rate = window.add(now, status.total - status.pending)
            done = JobState(status.state).ended  # a plain string from a test poll reads the same
            if hint is not None and not done and now - last_hint_check >= hint_every_s:
                last_hint_check = now
                message = hint()
                if message and message != shown_hint:
                    say(message, progress=False)
                shown_hint = message
            columns = live.width if live is not None else plain_columns
            line = render_line(status, rate, columns=columns)
            if live is not None:
                say(line, progress=True)
            elif done or now - last_plain >= PLAIN_LINE_EVERY_S:
                say(line, progress=False)
                last_plain = now
            if done:
                if live is not None:
                    live.stop()
                    say(line, progress=False)  # the last line stays on screen
                return status
            if timeout_s is not None and now - started > timeout_s:
                raise WaitTimeout(f"job {status.job_id} not finished after {timeout_s:.0f} s")
            time.sleep(pause)


# A wait for the first claim shorter than this is not worth a word in the summary.
NOTED_WAIT_S = 1.0


def time_taken(status: JobStatus) -> str:
    """The job's time since its creation, its wait for a first claim where it had one (a busy queue,
    no worker yet), and its images/s over the rest."""
    took = format_duration(status.elapsed_s, tenths=True)
    waited = status.queued_s
    if waited is not None and waited >= NOTED_WAIT_S:
        took += f" ({format_duration(waited, tenths=True)} of it before the first claim)"
    rate = status.images_per_s
    return f"{took}, {rate:.1f} images/s" if rate > 0 else took


def summary_lines(status: JobStatus, reasons: Sequence[tuple[str, int]]) -> list[str]:
    """The closing summary: counts, time, rate, and the most common reasons images did not end done."""
    lines = [
        f"job {status.job_id} finished: {status.done} done, {status.failed} failed, "
        f"{status.rejected} rejected of {status.total} in {time_taken(status)}"
    ]
    if status.cancelled:
        lines[0] = lines[0].replace(" rejected of", f" rejected, {status.cancelled} cancelled of")
    if status.closed_reason:
        lines.append(f"  closed early: {status.closed_reason}")
    if (unread := status.unreadable_line()) is not None:
        lines.append(f"  {unread}")
    for reason, count in reasons:
        lines.append(f"  {count:>6} x {reason}")
    return [visible(line) for line in lines]  # reasons name files, which may hold escape sequences


def exit_code_for(status: JobStatus) -> int:
    """0 when every image is done, EXIT_FINISHED_WITH_FAILURES when some failed, were rejected or
    cancelled, the job closed early, or its scan could not read a folder (images left out of it)."""
    troubled = (
        status.failed
        or status.rejected
        or status.cancelled
        or status.closed_reason
        or status.unreadable_count
    )
    return EXIT_FINISHED_WITH_FAILURES if troubled else 0


class PercentLine:
    """A percentage on one line of a terminal, redrawn at most twice a second; called once per unit done
    (`detq export -o FILE`: once per image read)."""

    def __init__(self, label: str, total: int, stream: TextIO, every_s: float = 0.5) -> None:
        self.label, self.total, self.stream, self.every_s = label, max(total, 1), stream, every_s
        self.done = 0
        self.drawn: float | None = None  # never yet: the first call draws, whatever the clock reads

    def __call__(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self.drawn is None or now - self.drawn >= self.every_s:
            self.drawn = now
            self.stream.write(f"\r\x1b[2K{self.label}: {min(100, 100 * self.done // self.total)}%")
            self.stream.flush()

    def clear(self) -> None:
        """Erase the line."""
        self.stream.write("\r\x1b[2K")
        self.stream.flush()
