"""A worker decodes every image in full unless DETQ_FAST_DECODE asks for the reduced JPEG decode."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from db.images_repo import PendingImage
from detq.vocabulary import ImageStatus
from tests.support import CountsForwards, save_yolov8_like, write_jpeg
from worker.decode import DecodedImage
from worker.models.formats import FormatAdapter, ModelInput
from worker.models.loading import load_model_for_device
from worker.models.outputs import RawDetections
from worker.models.tensors import Pixels, size_of
from worker.pipeline import Ready, detect_images, prepare_image, ready
from worker.runtime import WorkerRuntime


@pytest.mark.parametrize(("fast", "decoded_size"), [(False, (2560, 1920)), (True, (1280, 960))])
def test_jpegs_are_decoded_in_full_unless_fast_decode_is_set(
    runtime: WorkerRuntime, tmp_path: Path, fast: bool, decoded_size: tuple[int, int]
) -> None:
    # Given a 2560x1920 JPEG and a YOLO export whose input is 640x640
    write_jpeg(tmp_path / "big.jpg", (2560, 1920))
    model = load_model_for_device(save_yolov8_like(tmp_path / "v8.torchscript"), "cpu")
    assert model.decode_target == (640, 640)
    image = PendingImage(
        id=1, job_id=1, path=str(tmp_path / "big.jpg"), root_index=0, status=ImageStatus.PENDING
    )
    # When the worker prepares it, for a job with fast decode or without
    prepared = prepare_image(runtime, model, image, [str(tmp_path)], fast_decode=fast)
    # Then it is decoded whole by default (by OpenCV, to an array), at a reduced DCT scale with fast decode
    # (by Pillow); the original size is kept
    assert isinstance(prepared, DecodedImage)
    assert size_of(prepared.image) == decoded_size
    assert isinstance(prepared.image, np.ndarray) is not fast
    assert (prepared.width, prepared.height) == (2560, 1920)
    assert prepared.scale_x == pytest.approx(2560 / decoded_size[0])


@dataclass(frozen=True)
class _RefusesWide:
    """A model's format adapter whose resize fails on images wider than 1000 pixels."""

    inner: FormatAdapter

    @property
    def name(self) -> str:
        return self.inner.name

    def shrink(self, image: Pixels) -> ModelInput:
        if size_of(image)[0] > 1000:
            raise ValueError("too wide to resize")
        return self.inner.shrink(image)

    def collate(self, inputs: Sequence[ModelInput], device: torch.device) -> Any:
        return self.inner.collate(inputs, device)

    def parse(self, output: Any, count: int) -> list[RawDetections]:
        return self.inner.parse(output, count)


def test_images_reach_the_model_at_its_input_size_and_a_failed_resize_fails_that_image_alone(
    runtime: WorkerRuntime, tmp_path: Path
) -> None:
    # Given a YOLO export (input 640x640), a 2560x1920 and a 400x300 JPEG, and a resize that fails on the
    # wide one
    write_jpeg(tmp_path / "wide.jpg", (2560, 1920))
    write_jpeg(tmp_path / "small.jpg", (400, 300))
    loaded = load_model_for_device(save_yolov8_like(tmp_path / "v8.torchscript"), "cpu")
    model = replace(loaded, adapter=_RefusesWide(loaded.adapter))
    images = [
        PendingImage(id=i, job_id=1, path=str(tmp_path / name), root_index=0, status=ImageStatus.PENDING)
        for i, name in enumerate(["wide.jpg", "small.jpg"], start=1)
    ]
    # When the worker detects on both
    prepared = ready(
        model, images[1], cast(DecodedImage, prepare_image(runtime, model, images[1], [str(tmp_path)]))
    )
    wide, small = detect_images(runtime, model, images, [str(tmp_path)])
    # Then the small one went to the model as its 640x640 letterboxed input, its geometry kept, and is done
    assert isinstance(prepared, Ready)
    assert prepared.model_input.pixels.shape == (640, 640, 3)
    assert (prepared.geometry.width, prepared.geometry.height) == (400, 300)
    assert small.status == ImageStatus.DONE and small.width == 400
    # And the wide one failed alone, saying why
    assert wide.status == ImageStatus.FAILED
    assert wide.reason == "cannot resize image for the model: ValueError: too wide to resize"


def test_a_batch_runs_in_forwards_within_the_cpu_pixel_budget(runtime: WorkerRuntime, tmp_path: Path) -> None:
    # Given five 200x100 JPEGs, a torchvision-format model (full-size inputs), a micro-batch of 4 and a
    # budget of two such images per forward
    for index in range(5):
        write_jpeg(tmp_path / f"{index}.jpg", (200, 100))
    counting = CountsForwards(runtime.default_model.module)
    model = replace(runtime.default_model, module=counting)
    worker = replace(runtime, settings=runtime.settings.replace(cpu_forward_pixels=40_000))
    images = [
        PendingImage(
            id=i, job_id=1, path=str(tmp_path / f"{i}.jpg"), root_index=0, status=ImageStatus.PENDING
        )
        for i in range(5)
    ]
    # When the worker detects on them
    results = detect_images(worker, model, images, [str(tmp_path)])
    # Then the model ran forwards of 2, 2 and 1 and every image is done with its box, in order
    assert counting.sizes == [2, 2, 1]
    assert [r.image_id for r in results] == [0, 1, 2, 3, 4]
    assert all(r.status == ImageStatus.DONE and len(r.detections) == 1 for r in results)
    # And with the default budget the micro-batch (4) bounds them
    counting.sizes.clear()
    detect_images(runtime, model, images, [str(tmp_path)])
    assert counting.sizes == [4, 1]


def test_decode_threads_give_the_same_results_in_order_as_decoding_inline(
    runtime: WorkerRuntime, tmp_path: Path
) -> None:
    # Given seven JPEGs and a missing file among them, a micro-batch of 2
    for index in range(7):
        write_jpeg(tmp_path / f"{index}.jpg", (160 + 16 * index, 120))
    names = ["0.jpg", "1.jpg", "gone.jpg", "2.jpg", "3.jpg", "4.jpg", "5.jpg", "6.jpg"]
    images = [
        PendingImage(id=i, job_id=1, path=str(tmp_path / name), root_index=0, status=ImageStatus.PENDING)
        for i, name in enumerate(names)
    ]
    inline = replace(runtime, settings=runtime.settings.replace(micro_batch=2))
    # When a worker decodes them on two threads (read one micro-batch ahead) and one decodes inline
    with ThreadPoolExecutor(2, thread_name_prefix="decode") as pool:
        threaded = detect_images(
            replace(inline, decode_executor=pool, decode_threads=2),
            inline.default_model,
            images,
            [str(tmp_path)],
        )
    expected = detect_images(inline, inline.default_model, images, [str(tmp_path)])
    # Then both give every image its result in input order: the missing one failed, the others done alike
    assert [r.image_id for r in threaded] == list(range(8))
    assert threaded[2].status == ImageStatus.FAILED and threaded[2].reason == "file not found"
    assert [(r.status, r.width, r.detections) for r in threaded] == [
        (r.status, r.width, r.detections) for r in expected
    ]
