"""Reads are confined to the job root and DETQ_ALLOWED_ROOTS, after following symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.paths import PathRejected, resolve_confined


def test_file_inside_root_is_allowed(tmp_path: Path) -> None:
    image = tmp_path / "a.jpg"
    image.write_bytes(b"x")
    assert resolve_confined(str(image), str(tmp_path), []) == image.resolve()


def test_symlink_escaping_root_is_rejected(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(b"x")
    os.symlink(outside / "secret.jpg", root / "link.jpg")
    with pytest.raises(PathRejected, match="outside the job root"):
        resolve_confined(str(root / "link.jpg"), str(root), [])


def test_dotdot_path_escaping_root_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "x.jpg").write_bytes(b"x")
    with pytest.raises(PathRejected):
        resolve_confined(str(root / ".." / "x.jpg"), str(root), [])


def test_symlink_within_root_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real.jpg").write_bytes(b"x")
    os.symlink(tmp_path / "real.jpg", tmp_path / "alias.jpg")
    assert (
        resolve_confined(str(tmp_path / "alias.jpg"), str(tmp_path), []) == (tmp_path / "real.jpg").resolve()
    )


def test_allowed_roots_limit_applies(tmp_path: Path) -> None:
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    allowed.mkdir()
    other.mkdir()
    (other / "a.jpg").write_bytes(b"x")
    with pytest.raises(PathRejected, match="DETQ_ALLOWED_ROOTS"):
        resolve_confined(str(other / "a.jpg"), str(other), [allowed.resolve()])


def test_directory_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "dir.jpg").mkdir()
    with pytest.raises(PathRejected, match="not a regular file"):
        resolve_confined(str(tmp_path / "dir.jpg"), str(tmp_path), [])
    with pytest.raises(FileNotFoundError):
        resolve_confined(str(tmp_path / "gone.jpg"), str(tmp_path), [])
