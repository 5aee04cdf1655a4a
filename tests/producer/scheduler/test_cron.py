"""Cron specs: 5 or 6 fields (seconds first), time zones, next and latest fire times in UTC."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from producer.scheduler.cron import CronError, CronSpec


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def test_six_fields_put_seconds_first() -> None:
    spec = CronSpec("*/3 * * * * *")
    assert spec.has_seconds
    assert spec.next_after(at(2026, 1, 1, 0, 0, 3)) == at(2026, 1, 1, 0, 0, 6)
    assert spec.latest_at_or_before(at(2026, 1, 1, 0, 0, 3)) == at(2026, 1, 1, 0, 0, 3)
    assert spec.latest_at_or_before(datetime(2026, 1, 1, 0, 0, 5, 999_999, tzinfo=UTC)) == at(
        2026, 1, 1, 0, 0, 3
    )


def test_five_fields_read_in_the_time_zone() -> None:
    spec = CronSpec("0 2 * * *", "Europe/Paris")
    # 02:00 in Paris in summer is 00:00 UTC
    assert spec.next_after(at(2026, 6, 1, 12, 0, 0)) == at(2026, 6, 2, 0, 0, 0)
    assert spec.latest_at_or_before(at(2026, 6, 2, 0, 30, 0)) == at(2026, 6, 2, 0, 0, 0)


@pytest.mark.parametrize(
    ("expression", "timezone", "message"),
    [
        ("* * * *", "UTC", "4 fields"),
        ("61 * * * *", "UTC", "not a valid"),
        ("0 2 * * *", "Mars/Olympus", "unknown time zone"),
    ],
)
def test_bad_specs_are_refused(expression: str, timezone: str, message: str) -> None:
    with pytest.raises(CronError, match=message):
        CronSpec(expression, timezone)


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        CronSpec("* * * * *").next_after(datetime(2026, 1, 1))
