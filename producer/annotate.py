"""Draw a job's detections on copies of its images: boxes, label and score, a colour per class."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont, ImageOps

from db.images_repo import DetectionRow

# Distinct, readable on photos; a class keeps its colour across images and jobs.
PALETTE = (
    "#ff3b30",
    "#34c759",
    "#007aff",
    "#ffcc00",
    "#af52de",
    "#ff9500",
    "#5ac8fa",
    "#ff2d55",
    "#a2845e",
    "#00c7be",
)


def colour_for(label_id: int) -> str:
    """The colour of a class."""
    return PALETTE[label_id % len(PALETTE)]


def annotate(
    image_path: Path, detections: Sequence[DetectionRow], out_path: Path, max_side: int | None = None
) -> bool:
    """Write a copy of the image (EXIF-upright, at its own resolution unless max_side caps it) with its
    detections drawn, in the format out_path's suffix names (JPEG where Pillow knows none). False where
    the image cannot be read (moved or changed since it ran); an error writing the copy (a full disk) is
    raised, as it is no image's."""
    try:
        canvas = annotated(image_path, detections, max_side)
    except OSError:
        return False
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fmt = Image.registered_extensions().get(out_path.suffix.lower(), "JPEG")
    if fmt in ("JPEG", "MPO"):
        canvas.save(out_path, "JPEG", quality=88)
    else:
        canvas.save(out_path, fmt)
    return True


def annotated(image_path: Path, detections: Sequence[DetectionRow], max_side: int | None) -> Image.Image:
    """The image, EXIF-upright (at most max_side where given), with its detections drawn: lines and labels
    sized to the picture (a 4000x3000 photo's text about 40 px high)."""
    with Image.open(image_path) as opened:
        canvas = (ImageOps.exif_transpose(opened) or opened).convert("RGB")
    scale = 1.0 if max_side is None else min(1.0, max_side / max(canvas.size))
    if scale < 1.0:
        canvas = canvas.resize((max(1, round(canvas.width * scale)), max(1, round(canvas.height * scale))))
    draw = ImageDraw.Draw(canvas)
    side = max(canvas.size)
    width = max(2, round(side / 400))
    font = ImageFont.load_default(size=max(11, round(side / 60)))
    for det in detections:
        box = (det.x1 * scale, det.y1 * scale, det.x2 * scale, det.y2 * scale)
        colour = colour_for(det.label_id)
        draw.rectangle(box, outline=colour, width=width)
        label = f"{det.label} {det.score:.2f}"
        text_box = draw.textbbox((0, 0), label, font=font)
        left, top = box[0], max(0.0, box[1] - (text_box[3] - text_box[1]) - width)
        text_box = draw.textbbox((left, top), label, font=font)
        draw.rectangle(text_box, fill=colour)
        draw.text((left, top), label, fill="#000000", font=font)
    return canvas
