"""Cron expressions with a time zone: 5 fields, or 6 with seconds first; next and latest fire times."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter


class CronError(ValueError):
    """A cron expression or time zone that cannot be used."""


@dataclass(frozen=True)
class CronSpec:
    """A cron expression evaluated in a time zone; every time returned is timezone-aware in UTC.

    Five fields are standard cron (minute resolution). Six fields put seconds first, as Quartz and Spring
    do (`*/5 * * * * *`: every 5 seconds), for tests and short intervals.
    """

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        fields = self.expression.split()
        if len(fields) not in (5, 6):
            raise CronError(
                f"cron {self.expression!r} has {len(fields)} fields; expected 5 "
                "(minute hour day month weekday) or 6 (seconds first)"
            )
        if not croniter.is_valid(self.expression, second_at_beginning=self.has_seconds):
            raise CronError(f"cron {self.expression!r} is not a valid expression")
        self.zone  # noqa: B018 - validates the time zone now rather than at the first tick

    @property
    def has_seconds(self) -> bool:
        """True for the 6-field form."""
        return len(self.expression.split()) == 6

    @property
    def zone(self) -> ZoneInfo:
        """The time zone the fields are read in."""
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise CronError(f"unknown time zone {self.timezone!r}") from exc

    def _iter(self, moment: datetime) -> croniter:
        if moment.tzinfo is None:
            raise ValueError("cron times must be timezone-aware")
        return croniter(self.expression, moment.astimezone(self.zone), second_at_beginning=self.has_seconds)

    def next_after(self, moment: datetime) -> datetime:
        """The first fire time strictly after moment."""
        return self._iter(moment).get_next(datetime).astimezone(UTC)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last fire time at or before moment: the scheduled time of a run that is due at moment."""
        previous = self._iter(moment).get_prev(datetime).astimezone(UTC)
        following = self.next_after(previous)
        return following if following <= moment else previous
