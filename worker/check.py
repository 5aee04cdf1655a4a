"""`detq check`: a model's answers through detq's pipeline against the plain way, on the user's own images.

The plain way is the loop a user writes first, with the model as saved (none of detq's rewrites, fp32,
one image a call): Pillow decodes the whole file, its EXIF orientation applied, in RGB; a torchvision-format
model gets `to_tensor` of it; a fixed-input export gets Ultralytics' letterbox of it (worker.models.letterbox,
whose parity with Ultralytics itself the suite tests). detq's way is a worker's: the model as a pool process
loads it here (its exact rewrites, its grouping of forwards, this machine's DETQ_* settings: precision, fast
decode, CPU optimisation), the worker's decode, micro-batches of DETQ_MICRO_BATCH, rows in original pixels.
Both apply the same thresholds and classes, so what is left to differ is what detq does to the model's
input and arithmetic. Each image's answers are compared box by box (worker.models.agreement).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageOps

from db.images_repo import DetectionRow
from detq.inference_settings import InferenceSettings
from detq.settings import Settings
from detq.vocabulary import Precision
from worker.decode import Geometry, decode_image
from worker.jpeg import exact_jpeg_decoder
from worker.models.agreement import MIN_IOU, SCORE_TOLERANCE, Agreement, agreement
from worker.models.formats import TorchvisionAdapter, to_source_pixels
from worker.models.loading import LoadedModel, load_as_saved
from worker.models.metadata import MetaOverrides
from worker.models.outputs import RawDetections, parse_torchvision_output
from worker.models.tensors import to_tensor
from worker.pipeline import decoded_rows, run_model
from worker.runtime import answering, load_configured

DEFAULT_SAMPLE = 16
# Sizes of the photos made up where no folder is given: both orientations, and sizes that pad differently.
MADE_UP_SIZES = ((640, 480), (1280, 960), (480, 640), (800, 600), (1024, 768), (500, 333))


@dataclass(frozen=True)
class ImageCheck:
    """One image: its size, and how detq's answer agrees with the plain way's (or why it was not compared)."""

    path: str
    width: int = 0
    height: int = 0
    agreement: Agreement | None = None
    error: str | None = None

    @property
    def agrees(self) -> bool:
        """Compared, and every box matched within the tolerance."""
        return self.agreement is not None and self.agreement.agrees


@dataclass(frozen=True)
class CheckReport:
    """What `detq check` found: the model, where and how it ran, and each image's comparison."""

    model: str
    device: str
    settings: str  # the inference settings both ways applied, in words
    trades: list[str]  # the settings on that trade exactness for speed (docs/models.md)
    forwards: str  # how detq groups this model's forwards (worker.models.batching)
    images: list[ImageCheck] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        """Every image compared agrees (and there was at least one)."""
        return bool(self.images) and all(image.agrees for image in self.images)

    def totals(self) -> Agreement:
        """Boxes over every image compared, with the largest differences."""
        compared = [i.agreement for i in self.images if i.agreement is not None]
        return Agreement(
            expected=sum(a.expected for a in compared),
            found=sum(a.found for a in compared),
            matched=sum(a.matched for a in compared),
            max_score_diff=max((a.max_score_diff for a in compared), default=0.0),
            max_corner_diff=max((a.max_corner_diff for a in compared), default=0.0),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with each image's recall and precision and the tolerance used."""
        total = self.totals()
        return {
            **{k: v for k, v in asdict(self).items() if k != "images"},
            "agrees": self.agrees,
            "min_iou": MIN_IOU,
            "score_tolerance": SCORE_TOLERANCE,
            "recall": round(total.recall, 6),
            "precision": round(total.precision, 6),
            "max_score_diff": total.max_score_diff,
            "max_corner_diff": total.max_corner_diff,
            "images": [
                {
                    "path": i.path,
                    "width": i.width,
                    "height": i.height,
                    "agrees": i.agrees,
                    "error": i.error,
                    **(_agreement_dict(i.agreement) if i.agreement is not None else {}),
                }
                for i in self.images
            ],
        }


def _agreement_dict(found: Agreement) -> dict[str, Any]:
    return {
        "plain_boxes": found.expected,
        "detq_boxes": found.found,
        "matched": found.matched,
        "max_score_diff": found.max_score_diff,
        "max_corner_diff": found.max_corner_diff,
    }


def trades_of(settings: Settings) -> list[str]:
    """The settings on here that trade exactness for speed (docs/models.md says by how much)."""
    trades = []
    if settings.fast_decode:
        trades.append("DETQ_FAST_DECODE=true")
    if settings.precision is not Precision.FP32:
        trades.append(f"DETQ_PRECISION={settings.precision}")
    if settings.cpu_optimize:
        trades.append("DETQ_CPU_OPTIMIZE=true")
    return trades


def check_model(
    model_path: Path, images: Sequence[Path], settings: Settings, device: str = "cpu"
) -> CheckReport:
    """Run the model the plain way and detq's way over these images, and compare each image's answers."""
    inference = InferenceSettings.from_settings(settings)
    plain = answering(_as_saved(model_path, device, inference), inference)
    detq = answering(load_configured(settings, model_path, device), inference)
    report = CheckReport(
        model=str(model_path),
        device=device,
        settings=inference.describe(),
        trades=trades_of(settings),
        forwards=detq.grouping.note,
    )
    found = _detq_rows(detq, images, settings)
    for image in images:
        try:
            expected, width, height = _plain_rows(plain, image)
        except Exception as exc:  # noqa: BLE001 - an image the plain way cannot read is said, not raised
            report.images.append(ImageCheck(str(image), error=f"the plain way cannot read it: {exc}"))
            continue
        rows = found.get(image)
        if isinstance(rows, str):
            report.images.append(ImageCheck(str(image), width, height, error=f"detq: {rows}"))
            continue
        assert rows is not None
        report.images.append(ImageCheck(str(image), width, height, agreement(_raw(expected), _raw(rows))))
    return report


def _as_saved(model_path: Path, device: str, inference: InferenceSettings) -> LoadedModel:
    """The model as its file has it: none of detq's rewrites, at fp32, one image a forward."""
    return load_as_saved(
        model_path,
        device,
        overrides=MetaOverrides(format=inference.model_format, input_size=inference.input_size),
        precision=Precision.FP32,
        micro_batch=1,
    )


def _plain_rows(model: LoadedModel, path: Path) -> tuple[tuple[DetectionRow, ...], int, int]:
    """The plain loop's answer for one image, as rows in its pixels; its size."""
    with Image.open(path) as opened:
        image = (ImageOps.exif_transpose(opened) or opened).convert("RGB")
    with torch.inference_mode():
        if isinstance(model.adapter, TorchvisionAdapter):
            (raw,) = parse_torchvision_output(model.module([to_tensor(image, model.device)]), expected=1)
        else:
            fitted = model.adapter.shrink(np.asarray(image))
            output = model.module(model.adapter.collate([fitted], model.device))
            raw = to_source_pixels(model.adapter.parse(output, 1)[0], fitted.transform)
    rows = decoded_rows(raw, Geometry(image.width, image.height, 1.0, 1.0), model.meta)
    return rows, image.width, image.height


def _detq_rows(
    model: LoadedModel, images: Sequence[Path], settings: Settings
) -> dict[Path, tuple[DetectionRow, ...] | str]:
    """detq's answers as a worker makes them: its decode, its forwards, its rows; or why an image failed."""
    found: dict[Path, tuple[DetectionRow, ...] | str] = {}
    ready = []
    for path in images:
        try:
            decoded = decode_image(
                path,
                target_size=model.decode_target if settings.fast_decode else None,
                max_pixels=settings.max_image_pixels,
                max_bytes=settings.max_file_bytes,
                jpeg=exact_jpeg_decoder(),
            )
        except Exception as exc:  # noqa: BLE001 - said per image, as a worker records it
            found[path] = f"cannot decode: {exc}"
            continue
        ready.append((path, model.adapter.shrink(decoded.image), decoded.geometry()))
    outcomes = run_model(model, [r[1] for r in ready], settings.micro_batch, settings.cpu_forward_pixels)
    for (path, _, geometry), outcome in zip(ready, outcomes, strict=True):
        if outcome.detections is None:
            found[path] = outcome.error or "inference failed"
        else:
            found[path] = decoded_rows(outcome.detections, geometry, model.meta)
    return found


def _raw(rows: Sequence[DetectionRow]) -> RawDetections:
    return RawDetections(
        boxes=torch.tensor([[r.x1, r.y1, r.x2, r.y2] for r in rows], dtype=torch.float64).reshape(-1, 4),
        labels=torch.tensor([r.label_id for r in rows], dtype=torch.int64),
        scores=torch.tensor([r.score for r in rows], dtype=torch.float64),
    )


def sample_of(paths: Sequence[Path], count: int) -> list[Path]:
    """count paths spread evenly over the list (all of them where there are fewer)."""
    if len(paths) <= count:
        return list(paths)
    step = len(paths) / count
    return [paths[int(i * step)] for i in range(count)]


@contextmanager
def made_up_photos(count: int) -> Iterator[list[Path]]:
    """count photos of mixed sizes, every fifth turned by EXIF, in a folder that lasts the context: for a
    check without a folder of the user's own (smooth random texture with filled ellipses, seeded)."""
    with tempfile.TemporaryDirectory(prefix="detq-check-") as folder:
        paths = []
        for index in range(count):
            width, height = MADE_UP_SIZES[index % len(MADE_UP_SIZES)]
            rng = np.random.default_rng(index)
            coarse = rng.integers(0, 255, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
            image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
            draw = ImageDraw.Draw(image)
            for _ in range(10):
                x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
                side = int(rng.integers(max(width, height) // 20, max(width, height) // 4))
                draw.ellipse([x, y, x + side, y + side], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
            exif = Image.Exif()
            exif[0x0112] = 6 if index % 5 == 4 else 1
            path = Path(folder) / f"made_up_{index:02d}.jpg"
            image.save(path, quality=90, exif=exif.tobytes())
            paths.append(path)
        yield paths
