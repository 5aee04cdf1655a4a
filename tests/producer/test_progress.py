"""The progress line: counts, rate window, ETA."""

from __future__ import annotations

import io

from producer.progress import RateWindow, format_duration, render_line, wait_with_progress
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


def test_rate_over_window() -> None:
    window = RateWindow(window_s=10)
    assert window.add(0.0, 0) == 0.0
    assert window.add(2.0, 20) == 10.0
    assert window.add(30.0, 50) == (50 - 20) / 28


def test_line_has_counts_rate_and_eta() -> None:
    line = render_line(_status(done=50, pending=50), rate=10.0, width=10)
    assert "[#####-----] 50/100" in line
    assert "10.0 img/s" in line and "ETA 5s" in line


def test_wait_returns_the_finished_status() -> None:
    states = iter([_status(1, 2), _status(3, 0, "finished")])
    out = io.StringIO()
    final = wait_with_progress(lambda: next(states), stream=out, interval_s=0)
    assert final.state == "finished"
    assert "3/3" in out.getvalue()
