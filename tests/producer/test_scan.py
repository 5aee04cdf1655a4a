"""Folder scanning: image files only, hidden entries and symlinked folders skipped, stable order."""

from __future__ import annotations

import os
from pathlib import Path

from producer.scan import is_image_name, scan_roots


def _touch(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_scan_yields_images_recursively_in_order(tmp_path: Path) -> None:
    for name in (
        "b.jpg",
        "a.PNG",
        "notes.txt",
        ".hidden.jpg",
        "sub/c.jpeg",
        ".cache/d.jpg",
        "sub/deeper/e.webp",
    ):
        _touch(tmp_path / name)
    found = [Path(f.path).relative_to(tmp_path).as_posix() for f in scan_roots([tmp_path])]
    assert found == ["a.PNG", "b.jpg", "sub/c.jpeg", "sub/deeper/e.webp"]


def test_no_recursive_stays_in_the_top_folder(tmp_path: Path) -> None:
    _touch(tmp_path / "a.jpg")
    _touch(tmp_path / "sub" / "b.jpg")
    assert [Path(f.path).name for f in scan_roots([tmp_path], recursive=False)] == ["a.jpg"]


def test_symlinked_folders_are_not_followed_but_file_links_are_listed(tmp_path: Path) -> None:
    root, other = tmp_path / "root", tmp_path / "other"
    _touch(other / "x.jpg")
    _touch(root / "a.jpg", b"12345")
    os.symlink(other, root / "linked_dir")
    os.symlink(other / "x.jpg", root / "link.jpg")
    os.symlink(root / "missing.jpg", root / "dangling.jpg")
    found = {Path(f.path).name: f for f in scan_roots([root])}
    assert set(found) == {"a.jpg", "link.jpg", "dangling.jpg"}
    assert found["a.jpg"].size_bytes == 5
    assert found["dangling.jpg"].size_bytes == 0


def test_root_index_follows_the_roots(tmp_path: Path) -> None:
    _touch(tmp_path / "r0" / "a.jpg")
    _touch(tmp_path / "r1" / "b.jpg")
    found = list(scan_roots([tmp_path / "r0", tmp_path / "r1"]))
    assert [(Path(f.path).name, f.root_index) for f in found] == [("a.jpg", 0), ("b.jpg", 1)]


def test_extension_check_is_case_insensitive() -> None:
    assert is_image_name("X.JPG") and is_image_name("y.tiff") and not is_image_name("z.jpg.txt")
