"""The COCO dataset writer: the same document whether its annotations are spooled or written after."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import Any, cast

import pytest

from db.images_repo import DetectionRow
from db.models import Image
from producer.coco import CocoDatasetWriter, coco_annotation, coco_image

INFO = {"description": "déjà vu"}
CATEGORIES = [{"id": 1, "name": "chat"}]


def _image(image_id: int) -> Image:
    return cast(Image, SimpleNamespace(id=image_id, path=f"/p/{image_id}.jpg", width=64, height=48))


def _boxes(count: int) -> list[DetectionRow]:
    return [DetectionRow(1, "chat", 0.5 + r / 10, r, r, r + 10.5, r + 20.25) for r in range(count)]


IMAGES = [(_image(i), _boxes(n)) for i, n in ((3, 2), (5, 0), (9, 3))]


def _document() -> dict[str, Any]:
    numbered = enumerate(((img.id, box) for img, boxes in IMAGES for box in boxes), start=1)
    return {
        "info": INFO,
        "images": [coco_image(image) for image, _ in IMAGES],
        "categories": CATEGORIES,
        "annotations": [coco_annotation(image_id, box, n) for n, (image_id, box) in numbered],
    }


def test_two_passes_and_one_pass_with_a_spool_write_json_dumps_document() -> None:
    expected = json.dumps(_document(), ensure_ascii=False) + "\n"
    # Given the images first, then their boxes (the export's two passes)
    out = io.StringIO()
    two = CocoDatasetWriter(out, INFO, CATEGORIES)
    for image, _ in IMAGES:
        two.add_image(image)
    two.end_images()
    for image, boxes in IMAGES:
        two.add_boxes(image.id, boxes)
    two.close()
    assert out.getvalue() == expected and (two.images, two.annotations) == (3, 5)
    # And each image with its boxes at once, the annotations spooled (detq run's one pass)
    out, spool = io.StringIO(), io.StringIO()
    one = CocoDatasetWriter(out, INFO, CATEGORIES, spool)
    for image, boxes in IMAGES:
        one.add_image(image)
        one.add_boxes(image.id, boxes)
    one.close()
    assert out.getvalue() == expected and (one.images, one.annotations) == (3, 5)


def test_an_empty_dataset_is_json_dumps_empty_document() -> None:
    out = io.StringIO()
    CocoDatasetWriter(out, INFO, []).close()
    assert json.loads(out.getvalue()) == {"info": INFO, "images": [], "categories": [], "annotations": []}


def test_out_of_order_calls_are_refused_not_written_into_a_broken_document() -> None:
    no_spool = CocoDatasetWriter(io.StringIO(), INFO, CATEGORIES)
    with pytest.raises(ValueError, match="need a spool"):
        no_spool.add_boxes(3, _boxes(1))
    no_spool.end_images()
    with pytest.raises(ValueError, match="before its annotations"):
        no_spool.add_image(_image(4))
