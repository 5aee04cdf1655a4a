"""Reads are confined to the job root and DETQ_ALLOWED_ROOTS: what was opened is what is checked."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from worker.paths import PathRejected, open_confined


def _opened(path: Path | str, root: Path, allowed: list[Path] | None = None) -> Path:
    with open_confined(str(path), str(root), allowed or []) as opened:
        opened.handle.read(1)
        return opened.real_path


def test_file_inside_root_is_allowed(tmp_path: Path) -> None:
    image = tmp_path / "a.jpg"
    image.write_bytes(b"x")
    assert _opened(image, tmp_path) == image.resolve()


def test_symlink_escaping_root_is_rejected(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(b"x")
    os.symlink(outside / "secret.jpg", root / "link.jpg")
    with pytest.raises(PathRejected, match="outside the job root"):
        _opened(root / "link.jpg", root)


def test_dotdot_path_escaping_root_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "x.jpg").write_bytes(b"x")
    with pytest.raises(PathRejected):
        _opened(f"{root}/../x.jpg", root)


def test_symlink_within_root_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real.jpg").write_bytes(b"x")
    os.symlink(tmp_path / "real.jpg", tmp_path / "alias.jpg")
    assert _opened(tmp_path / "alias.jpg", tmp_path) == (tmp_path / "real.jpg").resolve()


def test_allowed_roots_limit_applies(tmp_path: Path) -> None:
    allowed, other = tmp_path / "allowed", tmp_path / "other"
    allowed.mkdir()
    other.mkdir()
    (other / "a.jpg").write_bytes(b"x")
    with pytest.raises(PathRejected, match="DETQ_ALLOWED_ROOTS"):
        _opened(other / "a.jpg", other, [allowed.resolve()])


def test_directory_fifo_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "dir.jpg").mkdir()
    with pytest.raises(PathRejected, match="not a regular file"):
        _opened(tmp_path / "dir.jpg", tmp_path)
    os.mkfifo(tmp_path / "pipe.jpg")  # opened without waiting for a writer, then refused
    with pytest.raises(PathRejected, match="not a regular file"):
        _opened(tmp_path / "pipe.jpg", tmp_path)
    with pytest.raises(FileNotFoundError):
        _opened(tmp_path / "gone.jpg", tmp_path)


def test_a_root_replaced_by_a_symlink_after_the_job_was_made_does_not_move(tmp_path: Path) -> None:
    # Given a job root recorded as a real folder, then replaced by a symlink to a folder outside
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    (outside / "a.jpg").write_bytes(b"secret")
    os.symlink(outside, root)
    # When a file is read under the recorded root, Then what it resolves to is outside, and refused
    with pytest.raises(PathRejected, match="outside the job root"):
        _opened(root / "a.jpg", root)


def test_swapping_a_folder_for_a_symlink_in_a_loop_never_lets_a_read_out(tmp_path: Path) -> None:
    # Given a folder inside the root that another thread keeps swapping for a symlink to a secret
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.jpg").write_bytes(b"inside")
    outside.mkdir()
    (outside / "a.jpg").write_bytes(b"secret")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(root / "sub", root / "sub.real")
            os.symlink(outside, root / "sub")
            os.unlink(root / "sub")
            os.rename(root / "sub.real", root / "sub")

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    read: list[bytes] = []
    refused = 0
    deadline = time.monotonic() + 20
    try:
        # When reads race with it until both outcomes were seen often (the race really happened)
        while (len(read) < 50 or refused < 50) and time.monotonic() < deadline:
            try:
                with open_confined(str(root / "sub" / "a.jpg"), str(root), []) as opened:
                    read.append(opened.handle.read())
            except (PathRejected, FileNotFoundError):
                refused += 1
    finally:
        stop.set()
        swapper.join(timeout=5)
    # Then no read ever returned the secret
    assert b"secret" not in read
    assert len(read) >= 50 and refused >= 50, (len(read), refused)
