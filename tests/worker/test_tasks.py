"""Task arguments are ids only: anything else is refused before any work."""

from __future__ import annotations

import pytest

from worker.tasks import parse_batch_args


def test_ids_are_accepted() -> None:
    assert parse_batch_args(3, [1, 2, 5]) == (3, [1, 2, 5])


@pytest.mark.parametrize(
    ("job_id", "image_ids"),
    [("3", [1]), (0, [1]), (True, [1]), (1, []), (1, ["/etc/passwd"]), (1, [1.5]), (1, "12"), (1, [-1])],
)
def test_anything_but_ids_is_refused(job_id: object, image_ids: object) -> None:
    with pytest.raises(ValueError):
        parse_batch_args(job_id, image_ids)
