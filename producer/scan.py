"""What a job covers: folders walked as a stream (without the whole tree in memory), or image files
named and matched by globs (`detq run`), yielded as the image files to queue."""

from __future__ import annotations

import glob
import hashlib
import heapq
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar, NamedTuple

from detq.display import visible
from detq.errors import DetqError

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
# A longer path would not fit PostgreSQL's unique index led by images.path (about 2.7 KB per entry).
MAX_PATH_BYTES = 2048


class ScannedFile(NamedTuple):
    """An image file found under one of the job's roots (index into the roots list); a named tuple, as
    one is made per file."""

    path: str
    size_bytes: int
    mtime: float
    root_index: int
    refused: str | None = None  # why it is recorded as rejected instead of queued


def check_name(path: str) -> tuple[str, str | None]:
    """The path as it can be stored, and why it is refused: a name that is not UTF-8, a path too long.

    os.scandir hands back undecodable bytes as surrogates, which no database text column takes: such a
    path is stored with the bytes shown as \\xNN escapes (readable, not openable) and refused.
    """
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return shown, "file name is not valid UTF-8; rename the file to process it"
    if size > MAX_PATH_BYTES:
        digest = hashlib.sha256(path.encode("utf-8")).hexdigest()[:16]  # keeps shortened paths distinct
        return f"{path[:200]}...{digest}", f"path is {size} bytes long, over the limit of {MAX_PATH_BYTES}"
    return path, None


@dataclass
class ScanNotes:
    """What a scan passed over, for its caller to tell: folders it could not list (whose images are in no
    job), files of other types, and how many image files it found."""

    images: int = 0
    other_files: int = 0
    other_example: str | None = None  # the first file of another type, to show what was passed over
    unreadable_count: int = 0
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (folder, reason), the first ones

    KEPT: ClassVar[int] = 20  # unreadable folders named; the rest are counted

    def passed_over(self, path: str) -> None:
        """A file with no image extension."""
        self.other_files += 1
        if self.other_example is None:
            self.other_example = path

    def unreadable_folder(self, folder: str, error: OSError) -> None:
        """A folder whose listing failed."""
        self.unreadable_count += 1
        if len(self.unreadable) < self.KEPT:
            self.unreadable.append((folder, error.strerror or type(error).__name__))

    def warnings(self, job_id: int, shown: int = 5) -> list[str]:
        """What a user should hear of: the folders not read (the first `shown`), and a scan that found no
        image file at all (a wrong folder, or images of a type detq does not read)."""
        lines = [
            f"cannot read folder {folder} ({reason}): its images are not in job {job_id}"
            for folder, reason in self.unreadable[:shown]
        ]
        if self.unreadable_count > shown:
            lines.append(f"and {self.unreadable_count - shown} more folders that could not be read")
        if self.images == 0:
            kinds = "file of another type" if self.other_files == 1 else "files of other types"
            seen = (
                f" ({self.other_files} {kinds}, such as {Path(self.other_example).name})"
                if self.other_example is not None
                else ""
            )
            lines.append(f"no image files found{seen}; detq reads {', '.join(sorted(IMAGE_EXTENSIONS))}")
        return [visible(line) for line in lines]


def is_image_name(name: str) -> bool:
    """True for file names with a known image extension (case-insensitive)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def scan_roots(
    roots: Sequence[Path], *, recursive: bool = True, notes: ScanNotes | None = None
) -> Iterator[ScannedFile]:
    """Yield image files under each root in name order, folder by folder; hidden entries and symlinked
    folders are skipped.

    Symlinked files are yielded as found: the worker resolves them and rejects any that leave the root.
    What it passes over (a folder it cannot list, a file of another type) goes into notes. Memory holds
    one folder's names up to SORTED_IN_MEMORY; a larger folder is sorted in runs spilled to a temporary
    file and merged (a million files in one folder: an enqueue stays under 100 MB).
    """
    notes = notes if notes is not None else ScanNotes()
    for index, root in enumerate(roots):
        stack = [str(root)]
        while stack:
            folder = stack.pop()
            subfolders = []
            try:
                listing = _sorted_listing(folder, notes)
                for name, is_folder in listing:
                    path = os.path.join(folder, name)
                    if is_folder:
                        if recursive:
                            subfolders.append(path)
                        continue
                    if not is_image_name(name):
                        notes.passed_over(path)
                        continue
                    try:
                        info = os.stat(path)
                        size, mtime = info.st_size, info.st_mtime
                    except OSError:  # a dangling symlink: the worker records why it cannot be read
                        size, mtime = 0, 0.0
                    stored, refused = check_name(path)
                    notes.images += 1
                    yield ScannedFile(stored, size, mtime, index, refused)
            except OSError as error:  # unreadable, or gone since its parent was listed
                notes.unreadable_folder(folder, error)
                continue
            stack.extend(reversed(subfolders))


# Entries of one folder sorted in memory; a larger folder is sorted in runs of this many (each a few MB).
SORTED_IN_MEMORY = 20_000


def _sorted_listing(folder: str, notes: ScanNotes) -> Iterator[tuple[str, bool]]:
    """The folder's entries that are not hidden, (name, is a folder), in name order. Listed at once (an
    OSError here is the folder's own); a folder of more than SORTED_IN_MEMORY entries is sorted in runs
    spilled to a temporary file (NUL-separated: no name holds a NUL) and merged as it is read."""
    run: list[tuple[str, bool]] = []
    spilled: list[tuple[int, int]] = []  # (offset, length) of each sorted run in the spill file
    spill: IO[bytes] | None = None
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_folder = entry.is_dir(follow_symlinks=False)
            except OSError as error:
                notes.unreadable_folder(entry.path, error)
                continue
            run.append((entry.name, is_folder))
            if len(run) >= SORTED_IN_MEMORY:
                spill = spill or tempfile.TemporaryFile(prefix="detq-scan-")
                spilled.append(_spill_run(spill, run))
                run = []
    if spill is None:
        return iter(sorted(run))
    if run:
        spilled.append(_spill_run(spill, run))
    return _merged(spill, spilled)


def _spill_run(spill: IO[bytes], run: list[tuple[str, bool]]) -> tuple[int, int]:
    run.sort()
    data = b"".join(b"%c%s\0" % (b"d" if is_folder else b"f", os.fsencode(name)) for name, is_folder in run)
    offset = spill.seek(0, os.SEEK_END)
    spill.write(data)
    return offset, len(data)


def _merged(spill: IO[bytes], spilled: list[tuple[int, int]]) -> Iterator[tuple[str, bool]]:
    try:
        yield from heapq.merge(*(_read_run(spill, offset, length) for offset, length in spilled))
    finally:
        spill.close()


def _read_run(spill: IO[bytes], offset: int, length: int, block: int = 1 << 13) -> Iterator[tuple[str, bool]]:
    """One sorted run of the spill file, read a block at a time (the runs share the file: seek each time)."""
    left, position, carry = length, offset, b""
    while left > 0:
        spill.seek(position)
        data = spill.read(min(block, left))
        position, left = position + len(data), left - len(data)
        *whole, carry = (carry + data).split(b"\0")
        for item in whole:
            yield os.fsdecode(item[1:]), item[:1] == b"d"


GLOB_CHARACTERS = frozenset("*?[")


@dataclass(frozen=True)
class Selection:
    """What `detq run` was given, sorted out: folders (scanned whole), or image files, named or matched by
    globs (files: None for folders)."""

    folders: list[Path]
    files: list[Path] | None = None

    @property
    def roots(self) -> list[Path]:
        """The job's roots: the folders, or each file's folder (what its reads are confined to)."""
        if self.files is None:
            return self.folders
        return list(dict.fromkeys(file.parent for file in self.files))


class SelectionError(DetqError, ValueError):
    """Paths that name nothing detq can run, said in one line."""


def select_paths(arguments: Sequence[str]) -> Selection:
    """Sort `detq run`'s arguments: each a folder, an image file, or a glob (`photos/*.jpg`,
    `'cams/**/*.png'` quoted so that detq expands it, `**` reaching into subfolders). Folders, or files
    and globs: not both in one run (a folder's files are its scan's). Files are resolved to absolute
    paths under their resolved folders, each once, sorted."""
    folders: list[Path] = []
    files: list[Path] = []
    for argument in arguments:
        path = Path(argument).expanduser()
        if path.is_dir():
            folders.append(path)
        elif path.is_file():
            if not is_image_name(path.name):
                raise SelectionError(f"not an image file detq reads: {argument} (it reads {_extensions()})")
            files.append(path)
        elif GLOB_CHARACTERS & set(argument):
            # The image files it matches; the folders only where it matches no file ('cams/*' of folders)
            matched = sorted(glob.glob(os.path.expanduser(argument), recursive=True))
            found = [Path(m) for m in matched if os.path.isfile(m) and is_image_name(m)]
            if not found:
                found_folders = [Path(m) for m in matched if os.path.isdir(m)]
                if not found_folders:
                    raise SelectionError(f"no image file or folder matches {argument}")
                folders += found_folders
            files += found
        else:
            raise SelectionError(f"no such file or folder: {argument}")
    if folders and files:
        raise SelectionError(
            f"give folders, or files and globs, not both in one run ({folders[0]} is a folder, {files[0]} a"
            " file): name the folder alone, or quote a glob of its files ('photos/*.jpg') for detq to expand"
        )
    if not files:
        return Selection(folders)
    resolved = {file.parent.resolve() / file.name for file in files}
    return Selection([], sorted(resolved))


def _extensions() -> str:
    return ", ".join(sorted(IMAGE_EXTENSIONS))


def scan_files(files: Sequence[Path], roots: Sequence[Path], notes: ScanNotes) -> Iterator[ScannedFile]:
    """The files of a Selection, as scan_roots yields a folder's: each under the first of the roots that
    holds it (a file under none is refused: only a caller's mistake)."""
    for file in files:
        index = next((i for i, root in enumerate(roots) if file.is_relative_to(root)), -1)
        try:
            info = file.stat()
            size, mtime = info.st_size, info.st_mtime
        except OSError:  # gone since it was named: the worker records why it cannot be read
            size, mtime = 0, 0.0
        stored, refused = check_name(str(file))
        notes.images += 1
        if index < 0:
            yield ScannedFile(stored, size, mtime, 0, "not under any of the job's folders")
        else:
            yield ScannedFile(stored, size, mtime, index, refused)
