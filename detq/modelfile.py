"""Model file identity and embedded metadata, read without torch (a TorchScript file is a zip archive)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

META_EXTRA_FILE = "detq.json"


def file_sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes: the identity of a model."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def read_embedded_meta(path: Path) -> dict[str, Any]:
    """The detq.json extra file of a TorchScript archive, or {} if absent or not a zip."""
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if name.endswith(f"/extra/{META_EXTRA_FILE}"):
                    loaded = json.loads(archive.read(name).decode("utf-8"))
                    return loaded if isinstance(loaded, dict) else {}
    except (zipfile.BadZipFile, OSError, ValueError):
        return {}
    return {}
