"""Enqueue root checks: real folders, inside DETQ_ALLOWED_ROOTS, no file listed twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.enqueue import EnqueueError, check_roots


def test_nested_and_repeated_roots_collapse_when_recursive(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    roots = [tmp_path / "a" / "b", tmp_path / "a", tmp_path / "c", tmp_path / "a"]
    assert check_roots(roots, []) == [tmp_path / "a", tmp_path / "c"]
    assert check_roots(roots, [], recursive=False) == [tmp_path / "a" / "b", tmp_path / "a", tmp_path / "c"]


def test_missing_folder_and_outside_allowed_roots_are_refused(tmp_path: Path) -> None:
    with pytest.raises(EnqueueError, match="not a folder"):
        check_roots([tmp_path / "nope"], [])
    (tmp_path / "x").mkdir()
    (tmp_path / "allowed").mkdir()
    with pytest.raises(EnqueueError, match="DETQ_ALLOWED_ROOTS"):
        check_roots([tmp_path / "x"], [tmp_path / "allowed"])
