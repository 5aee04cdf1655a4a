"""Reading model archives without torch: kind, extra files, saved devices, baked device constants."""

from __future__ import annotations

import zipfile
from pathlib import Path

from detq.modelfile import (
    archive_kind,
    code_device_constants,
    identify_model_file,
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


def test_files_detq_cannot_run_are_named_with_the_command_that_converts_them(tmp_path: Path) -> None:
    # Given the model files people have beside the ones detq runs, each made as its users make it
    import torch

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    torch.save(net.state_dict(), tmp_path / "weights.pth")
    torch.save({"epoch": 3, "model_state_dict": net.state_dict()}, tmp_path / "ckpt.pth")
    torch.save(net, tmp_path / "whole.pt")
    torch.save(net, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07\x12\x07pytorch\x1a\x032.6")
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    (tmp_path / "w.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    (tmp_path / "notes.txt").write_text("not a model")
    # When each is identified (no torch import needed: the pickles' opcodes are read, never run)
    found = {p.name: identify_model_file(p) for p in tmp_path.iterdir()}
    # Then the ones detq runs run, and each other one says what it is and how to convert it, in one line
    assert identify_model_file(save_fixed_box_model(tmp_path / "ts.pt")).runs
    assert identify_model_file(save_exported_boxes(tmp_path / "b.pt2")).runs
    assert {name: kind.kind for name, kind in found.items()} == {
        "weights.pth": "state_dict",
        "ckpt.pth": "state_dict",
        "whole.pt": "pickled_module",
        "legacy.pt": "pickled_module",
        "model.onnx": "onnx",
        "w.safetensors": "safetensors",
        "notes.txt": "unknown",
    }
    assert not any(kind.runs for kind in found.values())
    assert archive_kind(tmp_path / "weights.pth") == "unknown"  # a torch.save archive is no TorchScript
    line = found["ckpt.pth"].refusal("ckpt.pth")
    assert line.startswith("ckpt.pth is a training checkpoint (weights in a dict, no architecture)")
    assert "torch.load('ckpt.pth', weights_only=True)['model_state_dict']" in line and "\n" not in line
    whole = found["whole.pt"].refusal("whole.pt")
    assert (
        "torch.nn.modules.container.Sequential" in whole and "torch.jit.script(torch.load('whole.pt'" in whole
    )
    assert "docs/models.md#making-a-model-file" in found["notes.txt"].refusal("notes.txt")
