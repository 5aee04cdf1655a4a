"""Incremental scans: which scanned files are new, changed, worth retrying, or already done by a model."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from db.history_repo import PastOutcome, past_outcomes
from db.schedules_repo import RunCounts
from detq.vocabulary import ImageStatus
from producer.scan import ScannedFile

DEFAULT_MAX_RETRIES = 2

# A file with one of these outcomes for its current size and mtime needs nothing more: done, refused by
# policy (it would be refused again), or pending in a job still in flight.
_SETTLED = frozenset({ImageStatus.DONE.value, ImageStatus.REJECTED.value, ImageStatus.PENDING.value})


class Decision(enum.Enum):
    """What an incremental scan does with one file."""

    NEW = "new"
    CHANGED = "changed"
    RETRY = "retry"
    SKIP = "skip"


def decide(file: ScannedFile, history: Sequence[PastOutcome], max_retries: int) -> Decision:
    """NEW without history; CHANGED when no earlier row has its size and mtime; else SKIP once settled.

    Earlier failures of the same size and mtime are retried until the file has failed 1 + max_retries
    times; it is then skipped, and its last failed row keeps the reason.
    """
    history = [h for h in history if h.status != ImageStatus.CANCELLED]  # never looked at: as if unseen
    if not history:
        return Decision.NEW
    same = [h for h in history if h.size_bytes == file.size_bytes and h.mtime == file.mtime]
    if not same:
        return Decision.CHANGED
    if any(h.status in _SETTLED for h in same):
        return Decision.SKIP
    return Decision.RETRY if len(same) <= max_retries else Decision.SKIP


@dataclass
class Tally:
    """Running counts of an incremental scan."""

    new: int = 0
    changed: int = 0
    retried: int = 0
    skipped: int = 0

    def add(self, decision: Decision) -> None:
        """Count one file."""
        if decision is Decision.NEW:
            self.new += 1
        elif decision is Decision.CHANGED:
            self.changed += 1
        elif decision is Decision.RETRY:
            self.retried += 1
        else:
            self.skipped += 1

    def counts(self) -> RunCounts:
        """The totals, as stored on the job."""
        return RunCounts(new=self.new, changed=self.changed, retried=self.retried, skipped=self.skipped)


def select_files(
    session: Session,
    results: tuple[int, str],
    files: Sequence[ScannedFile],
    max_retries: int,
    tally: Tally,
) -> list[ScannedFile]:
    """The files of a scanned chunk that need processing for these results (a model's id and the key of
    the inference settings, detq.inference_settings); one query for the whole chunk."""
    model_id, settings_key = results
    history = past_outcomes(session, model_id, settings_key, [f.path for f in files])
    selected = []
    for file in files:
        decision = decide(file, history.get(file.path, ()), max_retries)
        tally.add(decision)
        if decision is not Decision.SKIP:
            selected.append(file)
    return selected
