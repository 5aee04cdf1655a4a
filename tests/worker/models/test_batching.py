"""Batch invariance by construction: an image's detections do not depend on what shares its forward."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from bench.photos import write_photo
from tests.support import save_scripted, save_torchvision_detector, save_yolov8_like
from worker.decode import decode_image
from worker.jpeg import exact_jpeg_decoder
from worker.models.agreement import agreement
from worker.models.batching import Padding, Rule, padding_of
from worker.models.loading import load_model_for_device
from worker.models.outputs import RawDetections, parse_torchvision_output
from worker.models.tensors import to_tensor
from worker.pipeline import run_model

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _padded_by_torchvision(transform: Any, width: int, height: int) -> tuple[int, int]:
    with torch.inference_mode():
        batch, _ = transform([torch.zeros(3, height, width)])
    return int(batch.tensors.shape[-2]), int(batch.tensors.shape[-1])


@pytest.mark.parametrize("scripted", [False, True], ids=["eager", "scripted"])
def test_the_padded_size_is_the_one_torchvision_pads_an_image_to_alone(scripted: bool) -> None:
    # Given torchvision's transform as Faster R-CNN builds it (eager, and scripted: the scripted one
    # computes its scale in float32) and seeded sizes, among them ones that resize to a rounding edge
    transform = GeneralizedRCNNTransform(320, 640, MEAN, STD).eval()
    if scripted:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            transform = torch.jit.script(transform)
    padding = padding_of(type("Detector", (), {"transform": transform})())
    assert padding == Padding(min_size=320, max_size=640, size_divisible=32)
    rng = np.random.default_rng(7)
    sizes = [(int(w), int(h)) for w, h in rng.integers(16, 1400, (150, 2))]
    sizes += [(640, 480), (480, 640), (1280, 960), (1000, 300), (4032, 3024), (321, 320), (960, 10)]
    # When the padded size is computed for each, Then it is torchvision's wherever it is given
    known = 0
    for width, height in sizes:
        computed = padding.padded(width, height)
        if computed is not None:
            known += 1
            assert computed == _padded_by_torchvision(transform, width, height), (width, height)
    # And it is given for nearly all sizes (the others fall back to their exact size)
    assert known >= len(sizes) - 3


def test_a_fixed_size_pads_every_image_alike() -> None:
    padding = Padding(min_size=320, max_size=320, size_divisible=1, fixed_size=(320, 320))
    assert {padding.padded(w, h) for w, h in [(640, 480), (10, 999), (320, 320)]} == {(320, 320)}


class _BatchMean(torch.nn.Module):
    """A list-of-images model whose box for each image moves with the size of its batch."""

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        level = torch.tensor(float(len(images)))
        out: list[dict[str, torch.Tensor]] = []
        for image in images:
            side = float(image.shape[-1])
            box = torch.stack([level * 10, level * 5, level * 10 + side / 2, level * 5 + side / 4])
            out.append(
                {"boxes": box[None], "labels": torch.ones(1, dtype=torch.int64), "scores": image.mean()[None]}
            )
        return out


class _PerImage(torch.nn.Module):
    """A list-of-images model that answers each image on its own (a box from its own mean pixel)."""

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = []
        for image in images:
            level = image.mean()
            box = torch.stack([level * 10, level * 5, level * 10 + 20, level * 5 + 10])
            out.append(
                {"boxes": box[None], "labels": torch.ones(1, dtype=torch.int64), "scores": level[None]}
            )
        return out


@pytest.mark.parametrize(
    ("build", "rule"),
    [
        (lambda p: save_torchvision_detector(p, "fasterrcnn"), Rule.PADDED),
        (lambda p: save_torchvision_detector(p, "ssdlite"), Rule.ANY),
        (save_yolov8_like, Rule.ANY),
        (lambda p: save_scripted(_PerImage(), p), Rule.SAME_SIZE),
        (lambda p: save_scripted(_BatchMean(), p), Rule.ONE),
    ],
    ids=["faster-rcnn", "ssdlite", "yolov8", "list-of-images", "batch-dependent"],
)
@pytest.mark.slow
def test_the_loosest_rule_a_probe_confirms_is_chosen_at_load(tmp_path: Path, build: Any, rule: Rule) -> None:
    # Given a model of each kind, When it is loaded for forwards of four
    loaded = load_model_for_device(build(tmp_path / "model.pt"), "cpu", micro_batch=4)
    # Then its grouping is the loosest its transform allows and the probe confirms, said in its notes
    assert loaded.grouping.rule is rule
    assert loaded.grouping.note in loaded.notes and loaded.grouping.note.startswith("forwards: ")


def test_a_batch_dependent_model_runs_one_image_a_forward_and_answers_as_alone(tmp_path: Path) -> None:
    # Given the model whose answers move with the batch, loaded as a worker loads it
    loaded = load_model_for_device(save_scripted(_BatchMean(), tmp_path / "m.pt"), "cpu", micro_batch=4)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (40, 60, 3), dtype=np.uint8) for _ in range(4)]
    # When four images of one size run through detq's forwards
    found = run_model(loaded, [loaded.adapter.shrink(i) for i in images], 4)
    # Then each image's answer is the one it gives alone
    for image, outcome in zip(images, found, strict=True):
        with torch.inference_mode():
            (alone,) = parse_torchvision_output(loaded.module([to_tensor(image)]), expected=1)
        assert outcome.detections is not None and agreement(alone, outcome.detections).agrees


@pytest.mark.slow
def test_a_model_that_takes_one_image_needs_no_probe(tmp_path: Path) -> None:
    loaded = load_model_for_device(
        save_torchvision_detector(tmp_path / "m.pt", "ssdlite"), "cpu", micro_batch=1
    )
    assert loaded.grouping.rule is Rule.ANY and "not probed" in loaded.grouping.note


def _plain_loop(module: Any, photo: Path) -> RawDetections:
    """What a user writes: Pillow, EXIF orientation, RGB, to_tensor, model([img]), one image a forward."""
    with Image.open(photo) as opened:
        image = ImageOps.exif_transpose(opened).convert("RGB")
    with torch.inference_mode():
        (found,) = parse_torchvision_output(module([to_tensor(image)]), expected=1)
    return found


@pytest.mark.slow
def test_mixed_size_photos_get_the_detections_they_get_alone(tmp_path: Path) -> None:
    # Given a RetinaNet (its transform keeps the aspect ratio and pads a batch to its largest image)
    # and photos of six sizes, two of them turned by EXIF
    model = load_model_for_device(
        save_torchvision_detector(tmp_path / "r.pt", "retinanet"), "cpu", micro_batch=8
    )
    sizes = [(640, 480), (1280, 960), (480, 640), (800, 600), (1024, 768), (640, 427)]
    photos = [
        write_photo(tmp_path / f"p{i}.jpg", *sizes[i % 6], seed=i, orientation=6 if i % 5 == 4 else 1)
        for i in range(10)
    ]
    # When detq's pipeline decodes them and runs them in forwards of up to eight (2.5 MP on a CPU)
    inputs = [
        model.adapter.shrink(
            decode_image(
                p, target_size=None, max_pixels=10**9, max_bytes=10**9, jpeg=exact_jpeg_decoder()
            ).image
        )
        for p in photos
    ]
    outcomes = run_model(model, inputs, 8, 2_500_000)
    # Then every photo's detections are those the plain loop finds, box for box
    for photo, outcome in zip(photos, outcomes, strict=True):
        assert outcome.detections is not None
        expected = _plain_loop(model.module, photo)
        agreed = agreement(expected, outcome.detections)
        assert expected.boxes.shape[0] > 0 and agreed.agrees, (photo.name, agreed)
