"""The message contract: ids only, a bounded number of them, and one batch-size range for every path."""

from __future__ import annotations

import pytest

from detq.contract import (
    MAX_BATCH_SIZE,
    BatchMessage,
    batches_of,
    check_batch_size,
    parse_batch_args,
    queue_for_pool,
    queues_of_worker_pool,
)
from detq.vocabulary import JobPool


def test_ids_are_accepted() -> None:
    message = parse_batch_args(3, [1, 2, 5])
    assert message == BatchMessage(job_id=3, image_ids=[1, 2, 5])
    assert message.args() == [3, [1, 2, 5]]


@pytest.mark.parametrize(
    ("job_id", "image_ids"),
    [
        ("3", [1]),
        (0, [1]),
        (True, [1]),
        (1, []),
        (1, ["/etc/passwd"]),
        (1, [1.5]),
        (1, "12"),
        (1, [-1]),
        (1, list(range(1, MAX_BATCH_SIZE + 2))),
    ],
)
def test_anything_but_ids_is_refused(job_id: object, image_ids: object) -> None:
    with pytest.raises(ValueError):
        parse_batch_args(job_id, image_ids)


def test_every_batch_made_is_one_a_worker_accepts() -> None:
    ids = list(range(1, 3001))
    cut = batches_of(ids, 20_000)  # a job recorded with a batch size larger than workers accept
    assert [len(b) for b in cut] == [MAX_BATCH_SIZE, MAX_BATCH_SIZE, 3000 - 2 * MAX_BATCH_SIZE]
    assert all(parse_batch_args(1, b).image_ids == b for b in cut)
    assert sum(cut, []) == ids


@pytest.mark.parametrize("size", [0, -1, MAX_BATCH_SIZE + 1, True])
def test_batch_sizes_outside_the_range_are_refused(size: int) -> None:
    with pytest.raises(ValueError, match=f"from 1 to {MAX_BATCH_SIZE}"):
        check_batch_size(size)


def test_pools_map_to_their_queues() -> None:
    assert [queue_for_pool(p) for p in JobPool] == ["any", "gpu", "cpu"]
    with pytest.raises(ValueError, match="unknown pool"):
        queue_for_pool("tpu")


def test_a_worker_rows_pool_names_the_queues_it_consumes() -> None:
    assert queues_of_worker_pool("cpu") == ("cpu", "any")
    assert queues_of_worker_pool("gpu") == ("gpu", "any")
    assert queues_of_worker_pool("tpu") == ()
