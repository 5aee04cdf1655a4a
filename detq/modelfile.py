"""Model file identity and what its archive says, read without torch (TorchScript and .pt2 files are zips)."""

from __future__ import annotations

import hashlib
import io
import json
import pickletools
import re
import zipfile
from dataclasses import dataclass
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
    # TorchScript holds its code and constants; a torch.save() archive (a state_dict, a pickled module, an
    # Ultralytics checkpoint) has a data.pkl too, but no code: identify_model_file says what it is.
    if any("/code/" in n for n in names) or any(n.endswith("/constants.pkl") for n in names):
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


MAKING_A_MODEL_FILE = "docs/models.md#making-a-model-file"
# Modules a torch.save() pickle of plain weights names: containers, tensors and their storages.
_WEIGHTS_ONLY_MODULES = frozenset(
    {
        "collections",
        "torch",
        "torch._utils",
        "builtins",
        "__builtin__",
        "_codecs",
        "numpy",
        "numpy.core.multiarray",
    }
    | {"numpy._core.multiarray"}
)
# Keys of a training checkpoint's dict (weights and the optimiser's state, no architecture).
_CHECKPOINT_KEYS = frozenset({"model_state_dict", "state_dict", "optimizer", "optimizer_state_dict", "epoch"})
_MAX_PICKLE_BYTES = 64 << 20  # a data.pkl holds the structure only (tensors are separate members)


@dataclass(frozen=True)
class ModelFileKind:
    """What a file is, read without torch and without unpickling it (the archive's members and the pickle's
    opcodes), and, where detq cannot run it, the command that makes one it can."""

    # torchscript, export, state_dict, pickled_module, ultralytics_checkpoint, onnx, safetensors, unknown
    kind: str
    what: str  # in words
    fix: str = ""  # the command that turns it into a file detq runs ("" where it runs)

    @property
    def runs(self) -> bool:
        """A TorchScript or torch.export archive: what workers load."""
        return self.kind in ("torchscript", "export")

    def refusal(self, shown: str) -> str:
        """One line: what the file is, and what to do."""
        return f"{shown} is {self.what}, not a model file detq runs (TorchScript or torch.export): {self.fix}"


def identify_model_file(path: Path) -> ModelFileKind:
    """What a model file is: one detq runs, or a state_dict, a pickled module, an Ultralytics checkpoint, an
    ONNX or safetensors file, each with the command that converts it. Nothing in the file is executed."""
    kind = archive_kind(path)
    if kind == "export":
        return ModelFileKind("export", "a torch.export program")
    if kind == "torchscript":
        return ModelFileKind("torchscript", "a TorchScript archive")
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError as exc:
        return ModelFileKind(
            "unknown", f"unreadable ({exc.strerror or exc})", f"check the path ({MAKING_A_MODEL_FILE})"
        )
    pickled = _saved_pickle(path)
    if pickled is not None:
        return _kind_of_pickle(path, pickled)
    if path.suffix.lower() == ".onnx" or (
        head[:1] == b"\x08" and any(w in head[:1024] for w in (b"pytorch", b"onnx"))
    ):
        return ModelFileKind(
            "onnx",
            "an ONNX model",
            "export TorchScript from the PyTorch model it came from instead (Ultralytics: yolo export "
            f"model=best.pt format=torchscript; torchvision: torch.jit.script; {MAKING_A_MODEL_FILE})",
        )
    if len(head) > 10 and head[8:10] == b'{"' and int.from_bytes(head[:8], "little") < 100 << 20:
        return ModelFileKind(
            "safetensors",
            "a safetensors file (weights only, no architecture)",
            "build the model in Python, load the weights (safetensors.torch.load_file) and save "
            f"torch.jit.script(model.eval()) with torch.jit.save ({MAKING_A_MODEL_FILE})",
        )
    return ModelFileKind(
        "unknown",
        "a file of no kind detq knows",
        f"save the model with torch.jit.save or torch.export.save ({MAKING_A_MODEL_FILE})",
    )


def _saved_pickle(path: Path) -> bytes | None:
    """The pickle torch.save() wrote: an archive's data.pkl, or a legacy (non-zip) file's pickles; None
    for a file that is neither."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.filename.endswith("/data.pkl") and info.filename.count("/") == 1:
                    return archive.read(info) if info.file_size <= _MAX_PICKLE_BYTES else b""
            return None
    except zipfile.BadZipFile:
        pass
    except OSError:
        return None
    try:
        with path.open("rb") as handle:
            head = handle.read(_MAX_PICKLE_BYTES)
    except OSError:
        return None
    return head if head[:1] == b"\x80" else None  # a pickle's PROTO opcode: torch.save's legacy format


def _globals_of(data: bytes) -> tuple[list[str], set[str]]:
    """The 'module name' of every class or function the pickle (or consecutive pickles) would import, in
    order, and the strings it holds."""
    found: list[str] = []
    strings: list[str] = []
    stream = io.BytesIO(data)
    for _ in range(8):  # the legacy format is several pickles one after another
        try:
            for opcode, arg, _ in pickletools.genops(stream):
                if opcode.name == "GLOBAL" and isinstance(arg, str):
                    found.append(arg)
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]} {strings[-1]}")
                elif isinstance(arg, str):
                    strings.append(arg)
        except Exception:  # noqa: BLE001 - the end of the pickles (tensor bytes follow), or a damaged one
            break
        if stream.tell() >= len(data):
            break
    return found, set(strings)


def _kind_of_pickle(path: Path, data: bytes) -> ModelFileKind:
    imported, strings = _globals_of(data)
    shown = path.name
    if any(g.startswith("ultralytics.") for g in imported):
        return ModelFileKind(
            "ultralytics_checkpoint",
            "an Ultralytics checkpoint",
            f"export it once: yolo export model={shown} format=torchscript (writes "
            f"{path.stem}.torchscript beside it; {MAKING_A_MODEL_FILE})",
        )
    classes = [g for g in imported if g.split(" ", 1)[0] not in _WEIGHTS_ONLY_MODULES]
    if classes:
        top = classes[0].replace(" ", ".")
        return ModelFileKind(
            "pickled_module",
            f"a whole module saved with torch.save ({top}; a pickle, which needs its Python classes to load)",
            "script it once: torch.jit.save(torch.jit.script(torch.load("
            f"'{shown}', weights_only=False).eval()), 'model.pt') ({MAKING_A_MODEL_FILE})",
        )
    key = next((k for k in ("model_state_dict", "state_dict", "model") if k in strings), None)
    checkpoint = bool(strings & _CHECKPOINT_KEYS)
    weights = f"torch.load('{shown}', weights_only=True)" + (f"['{key}']" if checkpoint and key else "")
    return ModelFileKind(
        "state_dict",
        "a training checkpoint (weights in a dict, no architecture)"
        if checkpoint
        else "a state_dict (weights only, no architecture)",
        f"build the model in Python, load them and script it: model.load_state_dict({weights}); "
        f"torch.jit.save(torch.jit.script(model.eval()), 'model.pt') ({MAKING_A_MODEL_FILE})",
    )
