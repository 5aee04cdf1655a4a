"""Per-format model I/O: build the model's input from decoded images and read its output back into boxes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from detq.vocabulary import ModelFormat
from worker.models.letterbox import IDENTITY, InputTransform, images_to_batch, letterbox_image, stretch_image
from worker.models.metadata import ModelMeta
from worker.models.outputs import ModelOutputError, RawDetections, parse_torchvision_output
from worker.models.tensors import to_tensor
from worker.models.yolo import decode_final_boxes, decode_yolov5, decode_yolov8, yolo_tensor


class FormatAdapter(Protocol):
    """How one output format talks to a model."""

    @property
    def name(self) -> str:
        """The format's name."""
        ...

    def prepare(
        self, images: Sequence[Image.Image], device: torch.device
    ) -> tuple[Any, list[InputTransform]]:
        """Model input for these decoded images, and how to map its pixels back to each image."""
        ...

    def parse(self, output: Any, count: int) -> list[RawDetections]:
        """Detections per image, in model-input pixels."""
        ...


@dataclass(frozen=True)
class TorchvisionAdapter:
    """List of CHW float tensors in [0, 1] at native size in; list of dicts (or (losses, dicts)) out."""

    name: str = ModelFormat.TORCHVISION

    def prepare(
        self, images: Sequence[Image.Image], device: torch.device
    ) -> tuple[Any, list[InputTransform]]:
        return [to_tensor(img, device) for img in images], [IDENTITY] * len(images)

    def parse(self, output: Any, count: int) -> list[RawDetections]:
        return parse_torchvision_output(output, expected=count)


@dataclass(frozen=True)
class FixedInputAdapter:
    """A [B, 3, H, W] batch at the input size (letterboxed or stretched) in; raw YOLO or final boxes out."""

    name: str
    meta: ModelMeta

    def prepare(
        self, images: Sequence[Image.Image], device: torch.device
    ) -> tuple[Any, list[InputTransform]]:
        height, width = self.meta.fixed_input_size()
        resized: list[np.ndarray] = []
        transforms: list[InputTransform] = []
        for img in images:
            if self.meta.letterbox:
                canvas, transform = letterbox_image(img, width, height)
            else:
                canvas, transform = stretch_image(img, width, height)
            resized.append(canvas)
            transforms.append(transform)
        return images_to_batch(resized, self.meta.mean, self.meta.std, device), transforms

    def parse(self, output: Any, count: int) -> list[RawDetections]:
        pred = yolo_tensor(output).detach().to("cpu", torch.float32)
        conf, iou, max_det = self.meta.yolo_thresholds()
        if self.name == ModelFormat.YOLOV8:
            parsed = decode_yolov8(pred, conf=conf, iou=iou, max_det=max_det)
        elif self.name == ModelFormat.YOLOV5:
            parsed = decode_yolov5(pred, conf=conf, iou=iou, max_det=max_det)
        else:
            parsed = decode_final_boxes(pred, conf=conf, max_det=max_det)
        if len(parsed) != count:
            raise ModelOutputError(f"model returned {len(parsed)} results for a batch of {count}")
        return parsed


def adapter_for(meta: ModelMeta) -> FormatAdapter:
    """The adapter of a resolved format."""
    if meta.format is None or not meta.format.fixed_input:
        return TorchvisionAdapter()
    return FixedInputAdapter(name=meta.format, meta=meta)


def to_source_pixels(raw: RawDetections, transform: InputTransform) -> RawDetections:
    """Map detections from model-input pixels to the decoded image's pixels."""
    if transform == IDENTITY:
        return raw
    return RawDetections(boxes=transform.to_source(raw.boxes), labels=raw.labels, scores=raw.scores)
