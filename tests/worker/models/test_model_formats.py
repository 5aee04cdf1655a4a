"""Every supported model kind loads on the CPU, settles its format, and maps boxes back to image pixels."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

from detq.modelfile import code_device_constants, saved_tensor_devices
from tests.support import (
    letterbox_expectation,
    retag_archive_device,
    save_exported_boxes,
    save_final_boxes,
    save_fixed_box_model,
    save_traced_with_baked_device,
    save_yolov5_like,
    save_yolov8_like,
)
from worker.models.inspect import inspect_model, pack_model
from worker.models.loading import ModelLoadError, load_model_for_device
from worker.models.metadata import MetaOverrides
from worker.pipeline import forward_images

SIZES = [(640, 480), (480, 640), (1000, 300), (200, 200)]


def _detect(path: Path, size: tuple[int, int]) -> list[tuple[int, float, list[float]]]:
    model = load_model_for_device(path, "cpu")
    (raw,) = forward_images(model, [Image.new("RGB", size, (40, 80, 120))])
    return [
        (int(label), float(score), [float(v) for v in box])
        for box, label, score in zip(raw.boxes, raw.labels, raw.scores, strict=True)
    ]


@pytest.mark.parametrize("size", SIZES)
def test_yolov8_layout_with_ultralytics_config(tmp_path: Path, size: tuple[int, int]) -> None:
    path = save_yolov8_like(tmp_path / "v8.torchscript")
    model = load_model_for_device(path, "cpu")
    assert (model.meta.format, model.meta.source) == ("yolov8", "Ultralytics config.txt")
    assert model.meta.classes == ("cat", "dog")
    assert (model.meta.score_threshold, model.meta.iou_threshold, model.meta.max_detections) == (
        0.25,
        0.7,
        300,
    )
    (detection,) = _detect(path, size)
    label, score, box = detection
    assert (label, score) == (1, pytest.approx(0.9))
    assert box == pytest.approx(letterbox_expectation((270, 270, 370, 330), size), abs=1e-3)


@pytest.mark.parametrize("size", SIZES)
def test_yolov5_layout_scores_objectness_times_class(tmp_path: Path, size: tuple[int, int]) -> None:
    path = save_yolov5_like(tmp_path / "v5.torchscript")
    assert load_model_for_device(path, "cpu").meta.format == "yolov5"
    (detection,) = _detect(path, size)
    assert detection[0] == 1 and detection[1] == pytest.approx(0.72)
    assert detection[2] == pytest.approx(letterbox_expectation((270, 270, 370, 330), size), abs=1e-3)


def test_final_boxes_drop_padding(tmp_path: Path) -> None:
    path = save_final_boxes(tmp_path / "boxes.pt")
    (detection,) = _detect(path, (1000, 300))
    assert detection[0] == 0 and detection[1] == pytest.approx(0.88)
    assert detection[2] == pytest.approx(letterbox_expectation((270, 270, 370, 330), (1000, 300)), abs=1e-3)


def test_exported_program_is_moved_and_run_one_image_at_a_time(tmp_path: Path) -> None:
    path = save_exported_boxes(tmp_path / "boxes.pt2")
    model = load_model_for_device(path, "cpu")
    assert (model.kind, model.meta.format, model.max_batch) == ("export", "boxes", 1)
    (detection,) = _detect(path, (400, 200))
    # Given a stretched 64x64 input, x scales by 400/64 and y by 200/64
    assert detection[2] == pytest.approx([100.0, 50.0, 300.0, 100.0], abs=1e-3)


def test_baked_cuda_constant_is_repaired_before_the_first_forward(tmp_path: Path) -> None:
    path = save_traced_with_baked_device(tmp_path / "baked.pt")
    assert code_device_constants(path) == ["cuda:0"]
    if not torch.cuda.is_available():
        # Given the plain way: map_location alone loads it, and the first forward fails on this CPU host
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            naive = torch.jit.load(str(path), map_location="cpu")
        with pytest.raises(RuntimeError):
            naive(torch.zeros(1, 3, 64, 64))
    model = load_model_for_device(path, "cpu")
    assert model.repaired_devices == ("model: cuda:0 -> cpu",)
    detections = _detect(path, (64, 64))
    assert [d[1] for d in detections] == pytest.approx([0.8, 0.3])


def test_format_guess_and_the_ambiguous_n_by_6_warning(tmp_path: Path) -> None:
    path = save_final_boxes(tmp_path / "boxes.pt")
    no_meta = tmp_path / "no_meta.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.load(str(path)), str(no_meta))
    model = load_model_for_device(no_meta, "cpu")
    assert model.meta.format == "boxes"
    assert "ambiguous" in model.notes[0]
    forced = load_model_for_device(no_meta, "cpu", overrides=MetaOverrides(format="yolov5"))
    assert forced.meta.format == "yolov5" and not any("guessed" in n for n in forced.notes)


def test_sidecar_json_is_read_when_the_file_has_no_metadata(tmp_path: Path) -> None:
    model_path = save_fixed_box_model(tmp_path / "plain.pt", classes=("a", "b"))
    stripped = tmp_path / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.load(str(model_path)), str(stripped))
    (tmp_path / "model.json").write_text(json.dumps({"format": "torchvision", "classes": ["x", "y"]}))
    meta = load_model_for_device(stripped, "cpu").meta
    assert meta.classes == ("x", "y") and meta.source == "sidecar model.json"


def test_inspect_reports_devices_format_and_runs_here(tmp_path: Path) -> None:
    cpu_file = save_yolov8_like(tmp_path / "v8.pt")
    cuda_file = tmp_path / "v8_cuda.pt"
    retag_archive_device(cpu_file, cuda_file)
    assert saved_tensor_devices(cuda_file) == ["cuda:0"]
    report = inspect_model(cuda_file)
    assert report["loads_here"] is True
    assert report["saved_tensor_devices"] == ["cuda:0"]
    assert (report["format"], report["classes"], report["input_size"]) == (
        "yolov8",
        ["cat", "dog"],
        [640, 640],
    )
    baked = inspect_model(save_traced_with_baked_device(tmp_path / "baked.pt"))
    assert baked["baked_device_constants"] == ["cuda:0"]
    assert baked["repaired_device_constants"] == ["model: cuda:0 -> cpu"]


def test_pack_embeds_metadata(tmp_path: Path) -> None:
    source = save_yolov8_like(tmp_path / "v8.pt")
    meta_file = tmp_path / "meta.json"
    meta_file.write_text(
        json.dumps({"format": "yolov8", "classes": ["kitten", "puppy"], "score_threshold": 0.5})
    )
    packed = pack_model(source, meta_file, tmp_path / "packed.pt")
    model = load_model_for_device(Path(packed["path"]), "cpu")
    assert model.meta.classes == ("kitten", "puppy") and model.meta.score_threshold == 0.5
    assert model.meta.source == "detq.json in the model file"


def test_unsupported_ultralytics_task_is_refused(tmp_path: Path) -> None:
    path = save_yolov8_like(tmp_path / "v8.pt")
    seg = tmp_path / "seg.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.jit.load(str(path))
        torch.jit.save(module, str(seg), _extra_files={"config.txt": json.dumps({"task": "segment"})})
    with pytest.raises(ModelLoadError, match="segment"):
        load_model_for_device(seg, "cpu")
