"""Reading model archives without torch: kind, extra files, saved devices, baked device constants."""

from __future__ import annotations

import zipfile
from pathlib import Path

from detq.modelfile import (
    archive_kind,
    code_device_constants,
    read_embedded_meta,
    read_extra_file,
    saved_tensor_devices,
)
from tests.support import retag_archive_device, save_exported_boxes, save_fixed_box_model


def test_torchscript_archive(tmp_path: Path) -> None:
    path = save_fixed_box_model(tmp_path / "m.pt", classes=("a", "b"))
    assert archive_kind(path) == "torchscript"
    assert read_embedded_meta(path)["classes"] == ["a", "b"]
    assert read_extra_file(path, "config.txt") is None
    assert saved_tensor_devices(path) == ["cpu"]
    assert code_device_constants(path) == []
    retag_archive_device(path, tmp_path / "gpu.pt")
    assert saved_tensor_devices(tmp_path / "gpu.pt") == ["cuda:0"]


def test_torchscript_with_a_models_folder_in_its_code_is_not_an_export(tmp_path: Path) -> None:
    # Given a scripted torchvision detector's layout: code/__torch__/torchvision/models/... inside
    path = tmp_path / "tv.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("tv/data.pkl", b"")
        archive.writestr("tv/code/__torch__/torchvision/models/detection/ssd.py", "")
    assert archive_kind(path) == "torchscript"


def test_export_archive_and_non_archives(tmp_path: Path) -> None:
    assert archive_kind(save_exported_boxes(tmp_path / "b.pt2")) == "export"
    assert read_embedded_meta(tmp_path / "b.pt2")["format"] == "boxes"
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"nope")
    assert archive_kind(junk) == "unknown"
    assert read_embedded_meta(junk) == {} and saved_tensor_devices(junk) == []
