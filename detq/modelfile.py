"""Model file identity and what its archive says, read without torch (TorchScript and .pt2 files are zips)."""

from __future__ import annotations

import hashlib
import json
import pickletools
import re
import zipfile
from pathlib import Path
from typing import Any

META_EXTRA_FILE = "detq.json"
ULTRALYTICS_EXTRA_FILE = "config.txt"

_DEVICE_NAME = re.compile(r"^(cpu|cuda(:\d+)?|mps|xpu(:\d+)?|meta)$")
_CODE_DEVICE = re.compile(r"""torch\.device\(["']([a-z]+(?::\d+)?)["']\)""")


def file_sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes: the identity of a model."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def archive_kind(path: Path) -> str:
    """'export' for a torch.export program (.pt2), 'torchscript', or 'unknown' (not a zip archive)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return "unknown"
    # A torch.export archive has <name>/archive_format and <name>/models/<model>.json at its top level.
    if any(n.count("/") == 1 and n.endswith("/archive_format") for n in names) or any(
        n.count("/") == 2 and n.split("/")[1] == "models" and n.endswith(".json") for n in names
    ):
        return "export"
    if any(n.endswith("/data.pkl") for n in names) or any("/code/" in n for n in names):
        return "torchscript"
    return "unknown"


def read_extra_file(path: Path, name: str) -> str | None:
    """An extra file stored in the archive (`_extra_files` / `extra_files`), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if member.endswith(f"/extra/{name}"):
                    return archive.read(member).decode("utf-8")
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError):
        return None
    return None


def read_embedded_meta(path: Path) -> dict[str, Any]:
    """The detq.json extra file of a model archive, or {} if absent or unreadable."""
    text = read_extra_file(path, META_EXTRA_FILE)
    if not text:
        return {}
    try:
        loaded = json.loads(text)
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def saved_tensor_devices(path: Path) -> list[str]:
    """Devices the archive's tensors were saved on ('cpu', 'cuda:0', ...), from the pickles' storage tags.

    pickletools only lists opcodes: nothing in the file is executed.
    """
    found: set[str] = set()
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith((".pkl",)) or member.endswith("debug_pkl"):
                    continue
                for opcode, arg, _ in pickletools.genops(archive.read(member)):
                    if opcode.name in ("BINUNICODE", "SHORT_BINUNICODE", "UNICODE") and isinstance(arg, str):
                        if _DEVICE_NAME.match(arg):
                            found.add(arg)
    except (zipfile.BadZipFile, OSError, ValueError):
        return []
    return sorted(found)


def code_device_constants(path: Path) -> list[str]:
    """Devices written as constants in a TorchScript archive's code (a graph traced on a GPU carries them)."""
    found: set[str] = set()
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if "/code/" in member and member.endswith(".py"):
                    found.update(_CODE_DEVICE.findall(archive.read(member).decode("utf-8", errors="replace")))
    except (zipfile.BadZipFile, OSError):
        return []
    return sorted(found)
