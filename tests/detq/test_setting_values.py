"""Readers of setting values: what each takes, from strings and from Python values, and what it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from detq.setting_values import BadValue, Reader, boolean, choice, integer, number, optional, path, text
from detq.vocabulary import JobPool


@pytest.mark.parametrize(
    ("reader", "value", "expected"),
    [
        (integer(ge=1, le=10), "7", 7),
        (integer(ge=1, le=10), 10, 10),
        (integer(), 4.0, 4),
        (number(gt=0), "0.05", 0.05),
        (number(ge=0.0, le=1.0), 1, 1.0),
        (boolean, "TRUE", True),
        (boolean, "0", False),
        (boolean, 1, True),
        (choice(JobPool), "gpu", JobPool.GPU),
        (choice(JobPool), JobPool.CPU, JobPool.CPU),
        (text(r"[a-f]+", "hex"), "abc", "abc"),
        (path, "~/x", Path("~/x")),
        (optional(integer()), None, None),
    ],
)
def test_readers_take_their_values(reader: Reader, value: Any, expected: Any) -> None:
    read = reader(value)
    assert read == expected and type(read) is type(expected)


@pytest.mark.parametrize(
    ("reader", "value", "message"),
    [
        (integer(ge=1), "0", "must be at least 1, not 0"),
        (integer(le=10), 11, "must be at most 10, not 11"),
        (integer(), "1.5", "must be a whole number, not '1.5'"),
        (integer(), True, "must be a whole number, not True"),
        (number(gt=0), "0", "must be greater than 0, not 0.0"),
        (number(), "nan", "must be a finite number, not nan"),
        (boolean, "maybe", "must be true or false, not 'maybe'"),
        (boolean, 2, "must be true or false, not 2"),
        (choice(JobPool), "tpu", "must be one of any, gpu, cpu, not 'tpu'"),
        (text(r"[a-f]+", "hex"), "abz", "must be hex, not 'abz'"),
        (text(), 5, "must be text, not 5"),
        (path, "", "must be a path, not ''"),
        (integer(), None, "must be a whole number, not None"),
    ],
)
def test_readers_refuse_what_they_cannot_take(reader: Reader, value: Any, message: str) -> None:
    with pytest.raises(BadValue) as raised:
        reader(value)
    assert str(raised.value) == message
