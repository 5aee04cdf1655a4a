"""Test helpers: tiny models built in the tests, cuda-retagged archives, corrupt input folders."""

from __future__ import annotations

import json
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

from PIL import Image


def save_fixed_box_model(
    path: Path,
    *,
    classes: tuple[str, ...] = ("background", "thing"),
    input_size: list[int] | None = None,
    score_threshold: float | None = None,
) -> Path:
    """A scripted torchvision-format model: one box at 25%..75% of each input, label 1, score 0.9."""
    import torch

    class FixedBox(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.corners = torch.nn.Parameter(torch.tensor([0.25, 0.25, 0.75, 0.75]), requires_grad=False)

        def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
            out: list[dict[str, torch.Tensor]] = []
            for img in images:
                h = float(img.shape[1])
                w = float(img.shape[2])
                size = torch.tensor([w, h, w, h], device=img.device, dtype=img.dtype)
                out.append(
                    {
                        "boxes": (self.corners.to(img.dtype) * size).unsqueeze(0),
                        "labels": torch.ones(1, dtype=torch.int64, device=img.device),
                        "scores": torch.full((1,), 0.9, device=img.device, dtype=img.dtype),
                    }
                )
            return out

    meta: dict[str, Any] = {"format": "torchvision", "classes": list(classes)}
    if input_size is not None:
        meta["input_size"] = input_size
    if score_threshold is not None:
        meta["score_threshold"] = score_threshold
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(FixedBox().eval())
        torch.jit.save(scripted, str(path), _extra_files={"detq.json": json.dumps(meta)})
    return path


def retag_archive_device(src: Path, dst: Path, device: str = "cuda:0") -> int:
    """Copy a TorchScript archive with every tensor storage tagged for `device`, as a GPU host saves it.

    torch.jit.save pickles each storage as a persistent id holding its location string ('cpu', 'cuda:0');
    that string is the only thing a GPU-saved archive differs in. Returns how many tags were rewritten.
    """
    old = b"X\x03\x00\x00\x00cpu"  # BINUNICODE 'cpu' (pickle protocol 2, memoised once per file)
    encoded = device.encode()
    new = b"X" + len(encoded).to_bytes(4, "little") + encoded
    rewritten = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(("/data.pkl", "/constants.pkl")):
                rewritten += data.count(old)
                data = data.replace(old, new)
            zout.writestr(info, data)
    return rewritten


def write_jpeg(path: Path, size: tuple[int, int], colour: tuple[int, int, int] = (90, 140, 200)) -> Path:
    """A plain JPEG of the given (width, height)."""
    Image.new("RGB", size, colour).save(path, "JPEG", quality=90)
    return path


def write_corrupt_folder(folder: Path, outside: Path) -> dict[str, str]:
    """Good and bad inputs side by side; returns file name -> expected terminal status."""
    folder.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    expected: dict[str, str] = {}
    for i, size in enumerate([(320, 240), (200, 300), (640, 360)]):
        write_jpeg(folder / f"good_{i}.jpg", size)
        expected[f"good_{i}.jpg"] = "done"
    (folder / "empty.jpg").write_bytes(b"")
    expected["empty.jpg"] = "failed"
    full = (folder / "good_0.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(full[: len(full) // 3])
    expected["truncated.jpg"] = "failed"
    (folder / "notes.jpg").write_text("this is not an image\n")
    expected["notes.jpg"] = "failed"
    secret = write_jpeg(outside / "secret.jpg", (100, 100))
    os.symlink(secret, folder / "escape.jpg")
    expected["escape.jpg"] = "rejected"
    return expected
