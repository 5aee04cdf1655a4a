"""A worker decodes every image in full unless DETQ_FAST_DECODE asks for the reduced JPEG decode."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from db.images_repo import PendingImage
from detq.vocabulary import ImageStatus
from tests.support import save_yolov8_like, write_jpeg
from worker.decode import DecodedImage
from worker.detect import prepare_image
from worker.models.loading import load_model_for_device
from worker.runtime import WorkerRuntime


@pytest.mark.parametrize(("fast", "decoded_size"), [(False, (2560, 1920)), (True, (1280, 960))])
def test_jpegs_are_decoded_in_full_unless_fast_decode_is_set(
    runtime: WorkerRuntime, tmp_path: Path, fast: bool, decoded_size: tuple[int, int]
) -> None:
    # Given a 2560x1920 JPEG and a YOLO export whose input is 640x640
    write_jpeg(tmp_path / "big.jpg", (2560, 1920))
    model = load_model_for_device(save_yolov8_like(tmp_path / "v8.torchscript"), "cpu")
    assert model.decode_target == (640, 640)
    worker = replace(runtime, settings=runtime.settings.model_copy(update={"fast_decode": fast}))
    image = PendingImage(
        id=1, job_id=1, path=str(tmp_path / "big.jpg"), root_index=0, status=ImageStatus.PENDING
    )
    # When the worker prepares it
    prepared = prepare_image(worker, model, image, [str(tmp_path)])
    # Then it is decoded whole by default, at a reduced DCT scale with fast decode; the original size is kept
    assert isinstance(prepared, DecodedImage)
    assert prepared.image.size == decoded_size
    assert (prepared.width, prepared.height) == (2560, 1920)
    assert prepared.scale_x == pytest.approx(2560 / decoded_size[0])
