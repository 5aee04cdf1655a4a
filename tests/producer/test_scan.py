"""Folder scanning: image files only, hidden entries and symlinked folders skipped, stable order; what it
passes over (unreadable folders, other files) noted."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from producer.scan import ScanNotes, SelectionError, is_image_name, scan_files, scan_roots, select_paths


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


def test_notes_count_images_and_the_files_passed_over(tmp_path: Path) -> None:
    for name in ("a.jpg", "sub/b.png", "readme.txt", "sub/c.heic"):
        _touch(tmp_path / name)
    notes = ScanNotes()
    assert len(list(scan_roots([tmp_path], notes=notes))) == 2
    assert (notes.images, notes.other_files, notes.unreadable_count) == (2, 2, 0)
    assert notes.other_example is not None and Path(notes.other_example).name == "readme.txt"
    assert notes.warnings(job_id=3) == []


def test_a_folder_gone_before_it_is_listed_is_noted_not_skipped_in_silence(tmp_path: Path) -> None:
    # Given a root whose file is listed before its two subfolders are
    _touch(tmp_path / "a.jpg")
    _touch(tmp_path / "b" / "x.jpg")
    _touch(tmp_path / "c" / "y.jpg")
    notes = ScanNotes()
    scan = scan_roots([tmp_path], notes=notes)
    assert Path(next(scan).path).name == "a.jpg"
    # When one subfolder disappears before the scan reaches it
    (tmp_path / "c" / "y.jpg").unlink()
    (tmp_path / "c").rmdir()
    # Then the scan goes on and notes the folder with the reason
    assert [Path(f.path).name for f in scan] == ["x.jpg"]
    assert notes.unreadable == [(str(tmp_path / "c"), "No such file or directory")]
    assert notes.warnings(job_id=3) == [
        f"cannot read folder {tmp_path / 'c'} (No such file or directory): its images are not in job 3"
    ]


def _scan_as_nobody(root: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Scan in a child process that runs as user nobody (root reads any folder whatever its mode)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setgid(65534)
            os.setuid(65534)
            notes = ScanNotes()
            names = [Path(f.path).name for f in scan_roots([root], notes=notes)]
            os.write(write, json.dumps([names, notes.unreadable]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        names, unreadable = json.loads(pipe.read() or "[[], []]")
    os.waitpid(pid, 0)
    return names, [(folder, reason) for folder, reason in unreadable]


def test_a_folder_the_scan_may_not_read_is_noted_with_the_reason() -> None:
    # Given a tree anyone may walk, with one subfolder no one but its owner may list
    root = Path(tempfile.mkdtemp(prefix="detq-scan-"))
    try:
        root.chmod(0o755)
        _touch(root / "open" / "a.jpg")
        _touch(root / "locked" / "b.jpg")
        for path in (root / "open", root / "open" / "a.jpg"):
            path.chmod(0o755)
        (root / "locked").chmod(0o000)
        # When a user other than root scans it
        if os.geteuid() == 0:
            names, unreadable = _scan_as_nobody(root)
        else:
            notes = ScanNotes()
            names = [Path(f.path).name for f in scan_roots([root], notes=notes)]
            unreadable = notes.unreadable
        # Then the readable images are found and the locked folder is named with why
        assert names == ["a.jpg"]
        assert unreadable == [(str(root / "locked"), "Permission denied")]
    finally:
        (root / "locked").chmod(0o755)
        shutil.rmtree(root)


def test_warnings_name_a_few_folders_then_count_and_say_when_no_image_was_found() -> None:
    notes = ScanNotes()
    for i in range(7):
        notes.unreadable_folder(f"/data/f{i}", PermissionError(13, "Permission denied"))
    notes.passed_over("/data/notes.txt")
    lines = notes.warnings(job_id=9)
    assert lines[0] == "cannot read folder /data/f0 (Permission denied): its images are not in job 9"
    assert len(lines) == 7 and lines[5] == "and 2 more folders that could not be read"
    assert lines[6] == (
        "no image files found (1 file of another type, such as notes.txt); "
        "detq reads .bmp, .gif, .jpeg, .jpg, .png, .tif, .tiff, .webp"
    )
    many = ScanNotes()
    for i in range(ScanNotes.KEPT + 5):
        many.unreadable_folder(f"/d/{i}", PermissionError(13, "Permission denied"))
    assert (len(many.unreadable), many.unreadable_count) == (ScanNotes.KEPT, ScanNotes.KEPT + 5)


def test_run_takes_folders_or_files_and_globs_it_expands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a folder of photos, one a folder down, and a file of another kind
    for name in ("a.jpg", "b.png", "sub/c.jpg", "notes.txt"):
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "photos" / name).write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    photos = (tmp_path / "photos").resolve()
    # Then a folder is a folder; files and globs are image files, absolute, each once, sorted
    assert select_paths(["photos"]) == select_paths(["photos/"]) and select_paths(["photos"]).files is None
    chosen = select_paths(["photos/b.png", "photos/*.jpg", "photos/./b.png"])
    assert chosen.files == [photos / "a.jpg", photos / "b.png"] and chosen.roots == [photos]
    everywhere = select_paths(["photos/**/*.jpg"])  # quoted, detq expands it: ** reaches subfolders
    assert everywhere.files == [photos / "a.jpg", photos / "sub" / "c.jpg"]
    assert everywhere.roots == [photos, photos / "sub"]
    assert select_paths(["photos/s*"]).folders == [Path("photos/sub")]  # a glob of folders only
    # And what names nothing runnable is said in one line
    for arguments, said in (
        (["photos/none.jpg"], "no such file or folder: photos/none.jpg"),
        (["photos/*.gif"], "no image file or folder matches photos/*.gif"),
        (["photos/notes.txt"], "not an image file detq reads: photos/notes.txt"),
        (["photos", "photos/a.jpg"], "give folders, or files and globs, not both in one run"),
    ):
        with pytest.raises(SelectionError, match=said.replace("*", "[*]")):
            select_paths(arguments)


def test_named_files_scan_under_the_root_that_holds_them(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    for name in ("a.jpg", "sub/c.jpg"):
        (tmp_path / name).write_bytes(b"abc")
    notes = ScanNotes()
    found = list(scan_files([tmp_path / "a.jpg", tmp_path / "sub" / "c.jpg"], [tmp_path], notes))
    assert [(f.path, f.size_bytes, f.root_index, f.refused) for f in found] == [
        (str(tmp_path / "a.jpg"), 3, 0, None),
        (str(tmp_path / "sub" / "c.jpg"), 3, 0, None),
    ]
    assert notes.images == 2


def test_a_folder_larger_than_memory_sorts_is_spilled_and_merged_into_the_same_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import producer.scan

    # Given a folder of 230 images, subfolders, hidden entries and other files, some with odd names (a
    # newline, bytes that are not UTF-8, a space, characters past ASCII)
    odd = [b"line\nbreak.jpg", b"\xff\xfebad.jpg", b"with space.png", "caf\u00e9.jpg".encode()]
    for n in range(230):
        _touch(tmp_path / f"img{(n * 7919) % 230:04d}.jpg")
    for name in odd:
        (Path(os.fsdecode(bytes(tmp_path) + b"/" + name))).write_bytes(b"x")
    for name in ("sub/a.jpg", "sub/deeper/b.webp", "zz/c.jpg", ".hidden.jpg", ".cache/d.jpg", "notes.txt"):
        _touch(tmp_path / name)

    def scanned() -> tuple[list[tuple[str, int, float, str | None]], int, int, str | None]:
        notes = ScanNotes()
        found = [(f.path, f.size_bytes, f.mtime, f.refused) for f in scan_roots([tmp_path], notes=notes)]
        return found, notes.images, notes.other_files, notes.other_example

    in_memory = scanned()
    # When the scan may hold only 16 entries of a folder in memory (the rest spilled in sorted runs)
    monkeypatch.setattr(producer.scan, "SORTED_IN_MEMORY", 16)
    spilled = scanned()
    # Then it finds the same files, in the same order, with the same notes
    assert spilled == in_memory
    assert (in_memory[1], in_memory[2]) == (230 + len(odd) + 3, 1)
    # (the files of the top folder in name order, then each subfolder's, depth first)
    names = [os.path.relpath(os.fsdecode(os.fsencode(p)), tmp_path) for p, _, _, _ in in_memory[0]]
    top = [n for n in names if "/" not in n]
    assert names == top + ["sub/a.jpg", "sub/deeper/b.webp", "zz/c.jpg"]
    assert len(top) == 230 + len(odd)
    # (a name of bytes that are not UTF-8 is stored escaped, its place kept by its bytes)
    readable = [n for n in top if "\\x" not in n]
    assert readable == sorted(readable) and len(readable) == len(top) - 1
