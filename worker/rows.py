"""One image's detections in decoded pixels to ledger rows in original pixels, clamped, sorted by score."""

from __future__ import annotations

import torch

from db.images_repo import DetectionRow
from worker.decode import Geometry
from worker.models.metadata import ModelMeta
from worker.models.outputs import RawDetections


def to_detection_rows(
    raw: RawDetections,
    *,
    scale_x: float,
    scale_y: float,
    width: int,
    height: int,
    meta: ModelMeta,
    score_threshold: float | None,
) -> tuple[DetectionRow, ...]:
    """Scale boxes to original pixels, clamp them to the image, drop low scores and classes not kept
    (meta.keep_classes), sort by score."""
    keep = torch.isfinite(raw.boxes).all(dim=1).logical_and_(torch.isfinite(raw.scores))
    if score_threshold is not None:
        keep.logical_and_(raw.scores >= score_threshold)
    kept_ids = meta.kept_label_ids
    if kept_ids is not None:
        keep.logical_and_(torch.isin(raw.labels, torch.tensor(sorted(kept_ids), dtype=raw.labels.dtype)))
    scores = raw.scores[keep]
    order = torch.argsort(scores, descending=True, stable=True)
    # One index into the kept rows, in score order: the boxes, labels and scores gathered once each.
    taken = keep.nonzero().squeeze(1)[order]
    boxes = raw.boxes[taken]  # a copy: the views below scale and clamp it in place
    boxes[:, 0::2].mul_(scale_x).clamp_(0, width)
    boxes[:, 1::2].mul_(scale_y).clamp_(0, height)
    label_name = meta.label_name
    return tuple(
        DetectionRow(label_id, label_name(label_id), score, x1, y1, x2, y2)
        for (x1, y1, x2, y2), label_id, score in zip(
            boxes.tolist(), raw.labels[taken].tolist(), scores[order].tolist(), strict=True
        )
    )


def decoded_rows(raw: RawDetections, decoded: Geometry, meta: ModelMeta) -> tuple[DetectionRow, ...]:
    """One decoded image's detections as ledger rows, at the model's score threshold (overrides folded in)."""
    return to_detection_rows(
        raw,
        scale_x=decoded.scale_x,
        scale_y=decoded.scale_y,
        width=decoded.width,
        height=decoded.height,
        meta=meta,
        score_threshold=meta.score_threshold,
    )
