"""The words every part of detq shares: pools, model formats, image statuses, job states, export formats."""

from __future__ import annotations

import enum


class JobPool(enum.StrEnum):
    """Where a job may run: the GPU pool, the CPU pool, or either (the `any` queue)."""

    ANY = "any"
    GPU = "gpu"
    CPU = "cpu"


class WorkerPool(enum.StrEnum):
    """The kinds of `detq worker` process pool."""

    GPU = "gpu"
    CPU = "cpu"


class ModelFormat(enum.StrEnum):
    """How a model takes its input and returns its detections (docs/models.md)."""

    TORCHVISION = "torchvision"
    YOLOV5 = "yolov5"
    YOLOV8 = "yolov8"
    BOXES = "boxes"

    @property
    def fixed_input(self) -> bool:
        """True for formats fed a letterboxed [B, 3, H, W] batch at one input size."""
        return self is not ModelFormat.TORCHVISION


class Precision(enum.StrEnum):
    """The width of a model's floating arithmetic (DETQ_PRECISION)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class ImageStatus(enum.StrEnum):
    """Life of an image row: pending, then exactly one terminal state."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"  # its job was cancelled before a worker got to it


TERMINAL_STATUSES = (ImageStatus.DONE, ImageStatus.FAILED, ImageStatus.REJECTED, ImageStatus.CANCELLED)


class JobState(enum.StrEnum):
    """A job's state, derived from its row and its images' statuses."""

    ENQUEUING = "enqueuing"
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        """No image of the job is left to run: finished, or cancelled."""
        return self in (JobState.FINISHED, JobState.CANCELLED)


class ExportFormat(enum.StrEnum):
    """What `detq export` writes."""

    CSV = "csv"
    JSONL = "jsonl"
    COCO = "coco"  # COCO results: a list of detections, as pycocotools' loadRes takes
    COCO_DATASET = "coco-dataset"  # images, categories and annotations


def choices(enum_type: type[enum.StrEnum]) -> list[str]:
    """The values of a StrEnum, for command-line choices and messages."""
    return [member.value for member in enum_type]
