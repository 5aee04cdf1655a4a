"""How a batch stopped at its soft time limit splits what it did not finish."""

from __future__ import annotations

from db.claims_repo import Claimable
from worker.time_limit import SentAgain, split_unfinished


def _free(*ids: int) -> list[Claimable]:
    return [Claimable(i, 1, f"/d/{i}.jpg", 0, 0, 7, None) for i in ids]


def test_each_image_in_flight_goes_alone_and_the_others_together() -> None:
    split = split_unfinished(_free(3, 4, 5, 6), in_flight={4, 6, 99})
    assert split == SentAgain(alone=[4, 6], together=[3, 5])
    assert split.groups == [[4], [6], [3, 5]]


def test_nothing_is_split_when_no_unfinished_image_was_in_flight() -> None:
    # Nothing says which image held the batch up, and the batch sent again whole might never shrink
    assert split_unfinished(_free(3, 4), in_flight=set()).groups == []
    assert split_unfinished(_free(3, 4), in_flight={9}).groups == []


def test_an_image_in_flight_with_no_others_left_goes_alone() -> None:
    assert split_unfinished(_free(8), in_flight={8}).groups == [[8]]
