"""Per-format model I/O: build the model's input from decoded images and read its output back into boxes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from detq.vocabulary import ModelFormat
from worker.models.letterbox import IDENTITY, images_to_batch, letterbox_image, stretch_image
from worker.models.metadata import ModelMeta
from worker.models.outputs import ModelOutputError, RawDetections, parse_torchvision_output
from worker.models.sampled_resize import SampledResize
from worker.models.tensors import Pixels, to_tensor
from worker.models.yolo import decode_final_boxes, decode_yolov5, decode_yolov8, yolo_tensor


class ToSource(Protocol):
    """How boxes in a model's input pixels map back to the decoded image's pixels."""

    def to_source(self, boxes: torch.Tensor) -> torch.Tensor:
        """[N, 4] x1, y1, x2, y2 boxes in the image's pixels (a new tensor)."""
        ...


@dataclass(frozen=True)
class ModelInput:
    """One image as its model takes it (before batching), and how to map its pixels back to the image."""

    # The decoded image (torchvision), 3 x H x W floats made ahead (torchvision, a sampled resize), or the
    # letterboxed H x W x 3 uint8 array (fixed input).
    pixels: Any
    transform: ToSource


class FormatAdapter(Protocol):
    """How one output format talks to a model."""

    @property
    def name(self) -> str:
        """The format's name."""
        ...

    def shrink(self, image: Pixels) -> ModelInput:
        """One decoded image at the model's input size, where the format has one: done per image, right
        after its decode, the full-size buffers of a large photo are reused by the next image instead of a
        micro-batch of them living at once."""
        ...

    def collate(self, inputs: Sequence[ModelInput], device: torch.device) -> Any:
        """The model's input for a micro-batch."""
        ...

    def parse(self, output: Any, count: int) -> list[RawDetections]:
        """Detections per image, in model-input pixels."""
        ...


@dataclass(frozen=True)
class TorchvisionAdapter:
    """List of CHW float tensors in [0, 1] at native size in (or, with `resize`, at the model's size,
    normalised and resized as its own transform would: worker.models.sampled_resize); list of dicts (or
    (losses, dicts)) out."""

    name: str = ModelFormat.TORCHVISION
    resize: SampledResize | None = None

    def shrink(self, image: Pixels) -> ModelInput:
        if self.resize is not None:
            return ModelInput(*self.resize.input_of(image))
        return ModelInput(image, IDENTITY)  # the model resizes it itself

    def collate(self, inputs: Sequence[ModelInput], device: torch.device) -> Any:
        return [
            item.pixels.to(device)
            if isinstance(item.pixels, torch.Tensor)
            else to_tensor(item.pixels, device)
            for item in inputs
        ]

    def parse(self, output: Any, count: int) -> list[RawDetections]:
        return parse_torchvision_output(output, expected=count)


@dataclass(frozen=True)
class FixedInputAdapter:
    """A [B, 3, H, W] batch at the input size (letterboxed or stretched) in; raw YOLO or final boxes out."""

    name: str
    meta: ModelMeta

    def shrink(self, image: Pixels) -> ModelInput:
        height, width = self.meta.fixed_input_size()
        resize = letterbox_image if self.meta.letterbox else stretch_image
        return ModelInput(*resize(image, width, height))

    def collate(self, inputs: Sequence[ModelInput], device: torch.device) -> Any:
        canvases: list[np.ndarray] = [item.pixels for item in inputs]
        return images_to_batch(canvases, self.meta.mean, self.meta.std, device)

    def parse(self, output: Any, count: int) -> list[RawDetections]:
        pred = yolo_tensor(output).detach().to("cpu", torch.float32)
        conf, iou, max_det = self.meta.yolo_thresholds()
        classes = self.meta.kept_label_ids
        if self.name == ModelFormat.YOLOV8:
            parsed = decode_yolov8(pred, conf=conf, iou=iou, max_det=max_det, classes=classes)
        elif self.name == ModelFormat.YOLOV5:
            parsed = decode_yolov5(pred, conf=conf, iou=iou, max_det=max_det, classes=classes)
        else:
            parsed = decode_final_boxes(pred, conf=conf, max_det=max_det, classes=classes)
        if len(parsed) != count:
            raise ModelOutputError(f"model returned {len(parsed)} results for a batch of {count}")
        return parsed


def adapter_for(meta: ModelMeta) -> FormatAdapter:
    """The adapter of a resolved format."""
    if meta.format is None or not meta.format.fixed_input:
        return TorchvisionAdapter()
    return FixedInputAdapter(name=meta.format, meta=meta)


def to_source_pixels(raw: RawDetections, transform: ToSource) -> RawDetections:
    """Map detections from model-input pixels to the decoded image's pixels."""
    if transform == IDENTITY:
        return raw
    return RawDetections(boxes=transform.to_source(raw.boxes), labels=raw.labels, scores=raw.scores)
