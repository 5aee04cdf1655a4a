"""DETQ_PRECISION: fp16 and bf16 run the model under autocast with float32 in and out, find the same boxes as
fp32 on the demo model, and a model that cannot run so fails at load with a way out."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision.ops import box_iou

from demo.shapes import random_image_size, render_scene
from detq.settings import BUNDLED_MODEL
from detq.vocabulary import Precision
from tests.support import save_scripted, ultralytics_config
from worker.models.inspect import inspect_model
from worker.models.loading import ModelLoadError, load_model_for_device
from worker.models.outputs import RawDetections
from worker.models.precision import ReducedPrecision, cast_floats, cpu_runs_it_natively
from worker.pipeline import forward_images


def test_only_floating_tensors_are_cast_however_deeply_they_sit() -> None:
    value = {"boxes": torch.ones(2, 4), "labels": torch.ones(2, dtype=torch.int64), "name": "x"}
    cast = cast_floats([value, (torch.zeros(1),)], torch.bfloat16)
    assert cast[0]["boxes"].dtype == torch.bfloat16 and cast[1][0].dtype == torch.bfloat16
    assert cast[0]["labels"].dtype == torch.int64 and cast[0]["name"] == "x"


def _scenes(count: int) -> list[Image.Image]:
    rng = random.Random(11)
    return [render_scene(rng, *random_image_size(rng))[0] for _ in range(count)]


def _matched(reference: RawDetections, other: RawDetections) -> tuple[int, float]:
    """How many reference boxes the other finds (same label, IoU >= 0.8), and the largest score change."""
    if len(reference.boxes) == 0 or len(other.boxes) == 0:
        return 0, 0.0
    iou = box_iou(reference.boxes, other.boxes)
    iou[reference.labels[:, None] != other.labels[None, :]] = 0
    best, index = iou.max(dim=1)
    found = best >= 0.8
    drift = (reference.scores[found] - other.scores[index[found]]).abs().max().item() if found.any() else 0.0
    return int(found.sum()), drift


@pytest.mark.slow
@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP16])
def test_half_precision_finds_the_demo_models_boxes_with_scores_near_fp32(precision: Precision) -> None:
    # Given the bundled demo detector loaded at full and at half width, and 12 generated scenes
    full = load_model_for_device(BUNDLED_MODEL, "cpu")
    half = load_model_for_device(BUNDLED_MODEL, "cpu", precision=precision)
    assert isinstance(half.module, ReducedPrecision)
    # (and says so where this CPU emulates the precision: the development machine's AVX2 does)
    assert any("runs emulated" in note for note in half.notes) == (not cpu_runs_it_natively(precision))
    images = _scenes(12)
    # When both detect
    reference, reduced = forward_images(full, images), forward_images(half, images)
    # Then detq reads float32 from both, and half width finds nearly every box fp32 finds, scores close
    total = sum(len(r.boxes) for r in reference)
    pairs = [_matched(a, b) for a, b in zip(reference, reduced, strict=True)]
    assert all(r.boxes.dtype == r.scores.dtype == torch.float32 for r in reduced)
    assert total >= 12
    assert sum(found for found, _ in pairs) >= 0.9 * total
    assert max(drift for _, drift in pairs) < 0.05


class _Float32Only(torch.nn.Module):
    """A YOLOv8-layout model that scatters its convolution's output into a float32 tensor: scatter wants
    both in one dtype, which autocast's half-width convolution breaks."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, stride=8, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).flatten(2)[:, :, :4]  # [B, 6, 4]
        index = torch.arange(4).expand(y.shape[0], 6, 4)
        return torch.zeros(y.shape[0], 6, 4).scatter_(2, index, y)


def test_a_model_that_cannot_run_at_half_width_fails_at_load_saying_how_to_run_it(tmp_path: Path) -> None:
    path = save_scripted(
        _Float32Only(), tmp_path / "fixed.torchscript", {"config.txt": ultralytics_config([32, 32])}
    )
    load_model_for_device(path, "cpu")  # runs at full width
    with pytest.raises(ModelLoadError, match="DETQ_PRECISION=fp32"):
        load_model_for_device(path, "cpu", precision=Precision.BF16)


def test_inspect_runs_a_model_at_the_precision_asked_and_keeps_the_format_source_apart() -> None:
    report = inspect_model(BUNDLED_MODEL, precision=Precision.BF16)
    assert report["loads_here"] is True and report["precision"] == "bf16"
    assert report["format_source"] == "detq.json in the model file"
    emulated = [note for note in report["notes"] if "runs emulated" in note]
    assert bool(emulated) == (not cpu_runs_it_natively(Precision.BF16))
