"""Annotated copies: the original's resolution, EXIF-upright, labels sized to the picture."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from db.images_repo import DetectionRow
from producer.annotate import annotate, annotated


def test_a_large_photo_keeps_its_resolution_and_gets_labels_it_can_be_read_at(tmp_path: Path) -> None:
    # Given a 4000x3000 photo with one box
    photo = tmp_path / "big.jpg"
    Image.new("RGB", (4000, 3000), (200, 200, 200)).save(photo, quality=90)
    box = DetectionRow(label_id=0, label="person", score=0.9, x1=1000, y1=1000, x2=2000, y2=2500)
    # When its annotated copy is written
    annotate(photo, [box], tmp_path / "copy.jpg")
    # Then the copy is 4000x3000, and its label (on the class colour, above the box) is some 40 px high
    with Image.open(tmp_path / "copy.jpg") as copy:
        assert copy.size == (4000, 3000)
        pixels = np.asarray(copy.convert("RGB")).astype(int)
    above = pixels[:990, 1000:1400]  # above the box, where its label is drawn
    red = np.flatnonzero(((above[:, :, 0] > 200) & (above[:, :, 1] < 120)).any(axis=1))  # its background
    assert 35 <= len(red) <= 90 and red.max() - red.min() + 1 == len(red), red
    # And a thumbnail (max_side) stays small, as the report draws them
    assert max(annotated(photo, [box], 320).size) == 320
