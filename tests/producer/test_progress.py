"""The progress line: counts, rate window, ETA."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from producer import progress
from producer.progress import (
    EXIT_FINISHED_WITH_FAILURES,
    PercentLine,
    RateWindow,
    exit_code_for,
    format_duration,
    render_line,
    summary_lines,
    time_taken,
    wait_with_progress,
)
from producer.status import JobStatus


def _status(done: int, pending: int, state: str = "running") -> JobStatus:
    return JobStatus(
        job_id=7,
        state=state,
        total=done + pending,
        pending=pending,
        done=done,
        failed=0,
        rejected=0,
        detections=0,
        pool="any",
        roots=["/x"],
        model_sha256="0" * 64,
        created_at="2026-11-30T00:00:00+00:00",
        finished_at=None,
        elapsed_s=1.0,
    )


def test_durations() -> None:
    assert [format_duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]
    # A time taken keeps tenths under 10 s: a job of a quarter of a second did not take "0s"
    taken = [format_duration(s, tenths=True) for s in (0.24, 4.4, 9.96, 65)]
    assert taken == ["0.2s", "4.4s", "10s", "1m05s"]


def test_rate_over_window() -> None:
    window = RateWindow(window_s=10)
    assert window.add(0.0, 0) == 0.0
    assert window.add(2.0, 20) == 10.0
    assert window.add(30.0, 50) == (50 - 20) / 28


def test_line_has_counts_rate_and_eta_and_fits_the_terminal() -> None:
    for columns in (120, 80, 60, 40):
        line = render_line(_status(done=50, pending=50), rate=10.0, columns=columns)
        assert len(line) <= columns, (columns, line)
        assert "50/100" in line and "10.0 img/s" in line and "ETA 5s" in line
    assert "[" + "#" * 15 + "-" * 15 + "] 50/100" in render_line(_status(50, 50), rate=10.0, columns=120)
    assert "[" not in render_line(_status(50, 50), rate=10.0, columns=60)  # no room for a bar


def test_wait_returns_the_finished_status() -> None:
    states = iter([_status(1, 2), _status(3, 0, "finished")])
    out = io.StringIO()
    final = wait_with_progress(lambda: next(states), stream=out, interval_s=0)
    assert final.state == "finished"
    assert "3/3" in out.getvalue()


def test_a_hint_is_printed_once_on_its_own_line() -> None:
    states = iter([_status(0, 3), _status(0, 3), _status(3, 0, "finished")])
    out = io.StringIO()
    wait_with_progress(
        lambda: next(states), stream=out, interval_s=0, hint=lambda: "no worker is listening", hint_every_s=0
    )
    assert out.getvalue().count("no worker is listening") == 1


def test_summary_names_the_top_reasons_and_the_exit_code_tells_failures() -> None:
    clean = _status(3, 0, "finished")
    assert exit_code_for(clean) == 0
    failed = JobStatus(**{**clean.as_dict(), "done": 1, "failed": 2, "elapsed_s": 4.0})
    lines = summary_lines(failed, [("empty file (0 bytes)", 2)])
    assert lines[0].startswith("job 7 finished: 1 done, 2 failed, 0 rejected of 3 in 4.0s")
    assert lines[1].strip() == "2 x empty file (0 bytes)"
    assert exit_code_for(failed) == EXIT_FINISHED_WITH_FAILURES


def test_the_rate_counts_from_the_first_claim_and_a_long_wait_before_it_is_named() -> None:
    # Given a job of 100 images that waited 600 s in a busy queue, then ran 50 s
    ran = JobStatus(
        **{
            **_status(100, 0, "finished").as_dict(),
            "elapsed_s": 650.0,
            "started_at": "2026-11-30T00:10:00+00:00",
            "running_s": 50.0,
        }
    )
    # Then its rate is over the 50 s it ran, and the summary names the wait
    assert ran.images_per_s == 2.0
    assert ran.queued_s == 600.0
    taken = "10m50s (10m00s of it before the first claim), 2.0 images/s"
    assert time_taken(ran) == taken
    assert summary_lines(ran, [])[0].endswith(f"of 100 in {taken}")
    # A job claimed within a second says nothing of it; one never started counts from its creation
    prompt = JobStatus(**{**ran.as_dict(), "elapsed_s": 50.4, "running_s": 50.0})
    assert time_taken(prompt) == "50s, 2.0 images/s"
    waiting = JobStatus(**{**_status(0, 100).as_dict(), "elapsed_s": 30.0})
    assert (waiting.queued_s, time_taken(waiting)) == (None, "30s")


class FakeClock:
    """time for wait_with_progress: a poll advances it; sleep records its pause and advances it too."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(round(seconds, 6))
        self.now += seconds


def test_a_slow_poll_is_repeated_less_often(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a job whose status takes 0.1 s to read (a job of millions of images), then 0.001 s
    clock = FakeClock()
    monkeypatch.setattr(progress, "time", clock)
    states = iter([(0.1, _status(0, 3)), (0.001, _status(1, 2)), (0.001, _status(3, 0, "finished"))])

    def poll() -> JobStatus:
        took, status = next(states)
        clock.now += took
        return status

    # When a command waits for it, polling every 0.5 s
    wait_with_progress(poll, stream=io.StringIO(), interval_s=0.5)
    # Then after the slow read it paused 19 times as long (polling is at most 5% of the wait), and
    # after a quick one the interval
    assert clock.pauses == [1.9, 0.5]


def test_a_wait_off_a_terminal_prints_plain_lines_without_loading_rich() -> None:
    """A pipe or a log gets plain lines; rich's import is CPU taken from the workers beside the wait."""
    code = (
        "import io, sys\n"
        "from producer.progress import wait_with_progress\n"
        "from tests.producer.test_progress import _status\n"
        "states = iter([_status(1, 2), _status(3, 0, 'finished')])\n"
        "out = io.StringIO()\n"
        "wait_with_progress(lambda: next(states), stream=out, interval_s=0)\n"
        "assert 'rich' not in sys.modules, 'rich imported'\n"
        "print(out.getvalue())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "3/3" in done.stdout and "\x1b[" not in done.stdout


def test_a_wait_on_a_terminal_redraws_its_line_and_leaves_the_last_one() -> None:
    # Given a terminal (a pseudo-terminal read from its other end)
    leader, follower = os.openpty()
    states = iter([_status(1, 2), _status(3, 0, "finished")])
    with open(follower, "w", encoding="utf-8", closefd=True) as terminal:
        # When a job is followed on it
        final = wait_with_progress(lambda: next(states), stream=terminal, interval_s=0)
    drawn = b""
    while _readable(leader):
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end is closed and read to its end
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    text = drawn.decode("utf-8", "replace")
    # Then the line was drawn, then redrawn in place (carriage return, erase line), and once the
    # progress display is gone the finished line stays printed
    assert final.state == "finished"
    first, redrawn = text.split("\r\x1b[2K", 1)
    assert "1/3 done" in first and "3/3 done" in redrawn
    assert "3/3 done" in text.rsplit("\x1b[2K", 1)[1] and text.endswith("\r\n")


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0.2)[0])


def test_a_percent_line_redraws_in_place_and_clears() -> None:
    out = io.StringIO()
    line = PercentLine("exporting job 3", 4, out, every_s=0)
    for _ in range(2):
        line()
    line.clear()
    assert out.getvalue() == "\r\x1b[2Kexporting job 3: 25%\r\x1b[2Kexporting job 3: 50%\r\x1b[2K"
    # Redrawn at most once an interval: the calls between count, unseen
    slow = io.StringIO()
    throttled = PercentLine("x", 100, slow, every_s=3600)
    for _ in range(100):
        throttled()
    assert (slow.getvalue(), throttled.done) == ("\r\x1b[2Kx: 1%", 100)
