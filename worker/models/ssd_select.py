"""An SSD's detections chosen from one image's class scores and boxes as torchvision's postprocess chooses
them, bit for bit, looking only at the candidates that can reach its output.

torchvision's SSD.postprocess_detections takes, per class, the boxes scoring above score_thresh, keeps the
top topk_candidates of each, suppresses overlaps class by class (batched_nms: one greedy NMS a class once
there are over 1,000 candidates) and returns the detections_per_img best survivors. On SSDlite (90 classes,
3,234 anchors) that is 90 compactions, 90 top-k calls and 90 NMS calls over up to 27,000 candidates for 300
detections: about half of its forward on one core.

Greedy NMS decides a box from the boxes scoring higher in its class alone. So the survivors scoring above
any value t are the survivors of the candidates scoring above t, and when at least detections_per_img + 1
of them are found, nothing below t can reach the output. Here the candidates above t are taken at once
(the best few hundred over all classes), each class's greedy NMS runs on them as a fixed point of one
matrix product, and t is lowered only when too few survive.

Where an order the reference leaves to its sort matters (equal scores within a class among its candidates,
or among the best survivors), or where the reference takes another path (1,000 candidates or fewer,
non-finite boxes), select returns None and the caller runs the model's own postprocess for that image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# torchvision's batched_nms on a CPU: one NMS a class only above this many box coordinates; at or below it,
# one NMS over boxes shifted apart by class, whose float arithmetic differs.
PER_CLASS_NMS_ABOVE = 4000
FIRST_TAKE_PER_DETECTION = 4  # the first candidates taken: this many per detection kept, then four times more


@dataclass(frozen=True)
class Chosen:
    """One image's detections in the model's input pixels, best first."""

    boxes: torch.Tensor  # float [N, 4]
    scores: torch.Tensor  # float [N]
    labels: torch.Tensor  # int64 [N]


@dataclass(frozen=True)
class SsdSelection:
    """An SSD's postprocess settings, as its attributes hold them."""

    score_thresh: float
    topk_candidates: int
    nms_thresh: float
    detections_per_img: int

    def select(self, scores: torch.Tensor, boxes: torch.Tensor) -> Chosen | None:
        """The detections for one image from its [A, C] class scores (softmax, background first) and its
        [A, 4] decoded, clipped boxes; None where the reference's own result must be taken (and for any
        dtype but float32, whose arithmetic below() assumes)."""
        if scores.dtype != torch.float32 or boxes.dtype != torch.float32:
            return None
        classes = scores[:, 1:]
        valid = classes > self.score_thresh
        counts = valid.sum(0)
        candidates = int(counts.clamp(max=self.topk_candidates).sum())
        if candidates * 4 <= PER_CLASS_NMS_ABOVE or not bool(torch.isfinite(boxes).all()):
            return None
        flat = torch.where(valid, classes, float("-inf")).reshape(-1)  # index: anchor * classes + class
        total = int(counts.sum())
        take = min(total, FIRST_TAKE_PER_DETECTION * self.detections_per_img)
        while True:
            values, at = flat.topk(take)
            complete = take == total
            if not complete:  # those above the lowest taken: every entry scoring above it is among them
                above = values > values[-1]
                values, at = values[above], at[above]
            chosen = self._from(values, at, classes.shape[1], boxes, complete)
            if chosen is not _TOO_FEW:
                return chosen
            take = min(total, 4 * take)

    def _from(
        self, values: torch.Tensor, at: torch.Tensor, n_classes: int, boxes: torch.Tensor, complete: bool
    ) -> Chosen | None:
        """The detections from the entries scoring above some value, best first (values descending, at:
        flat indices); _TOO_FEW where fewer than detections_per_img + 1 survive and there are more."""
        label, order = torch.sort(at % n_classes, stable=True)  # by class, best first within each
        values, anchor = values[order], (at // n_classes)[order]
        per_class = torch.bincount(label, minlength=n_classes)
        rank = torch.arange(label.numel()) - (per_class.cumsum(0) - per_class)[label]
        k = self.topk_candidates
        # Equal scores in a class among its candidates or at their cut: the reference's order is its sort's.
        if bool(((label[1:] == label[:-1]) & (values[1:] == values[:-1]) & (rank[1:] <= k)).any()):
            return None
        keep = rank < k
        label, values, anchor, rank = label[keep], values[keep], anchor[keep], rank[keep]
        survives = self._greedy_nms(label, rank, boxes[anchor])
        label, values, anchor = label[survives], values[survives], anchor[survives]
        wanted = self.detections_per_img
        if not complete and values.numel() <= wanted:
            return _TOO_FEW
        best, order = torch.sort(values, descending=True)
        shown = min(wanted + 1, best.numel())
        if bool((best[1:shown] == best[: shown - 1]).any()):  # the reference's order is its sort's
            return None
        order = order[:wanted]
        return Chosen(boxes=boxes[anchor[order]], scores=best[:wanted], labels=label[order] + 1)

    def _greedy_nms(self, label: torch.Tensor, rank: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Which candidates survive their class's greedy NMS (each class's candidates ranked best first),
        with torchvision's CPU kernel's arithmetic: float32 steps, the overlap compared as a double."""
        groups, group = torch.unique(label, return_inverse=True)
        width = int(rank.max()) + 1 if rank.numel() else 0
        slots = torch.zeros(groups.numel(), width, 4, dtype=boxes.dtype)
        slots[group, rank] = boxes
        filled = torch.zeros(groups.numel(), width, dtype=torch.bool)
        filled[group, rank] = True
        x1, y1, x2, y2 = (slots[..., i].contiguous() for i in range(4))
        areas = (x2 - x1) * (y2 - y1)
        w = torch.minimum(x2[:, :, None], x2[:, None, :]) - torch.maximum(x1[:, :, None], x1[:, None, :])
        h = torch.minimum(y2[:, :, None], y2[:, None, :]) - torch.maximum(y1[:, :, None], y1[:, None, :])
        inter = w.clamp(min=0) * h.clamp(min=0)
        overlap = inter / ((areas[:, :, None] + areas[:, None, :]) - inter)
        later = torch.ones(width, width, dtype=torch.bool).triu(diagonal=1)
        suppresses = (overlap > below(self.nms_thresh)) & later & filled[:, None, :]
        weights = suppresses.to(torch.float32)
        kept = filled
        # kept[j] = filled[j] and no kept i before j suppresses it: after n rounds the first n are right,
        # and the system has one solution, so a round that changes nothing has found it.
        for _ in range(width + 1):
            hit = torch.bmm(kept.to(torch.float32)[:, None, :], weights)[:, 0, :] > 0
            again = filled & ~hit
            if torch.equal(again, kept):
                break
            kept = again
        return kept[group, rank]


def below(threshold: float) -> float:
    """The largest float32 at or below threshold: a float32 x exceeds it exactly when x, taken as a double,
    exceeds threshold (as the kernel compares), and torch compares float32 tensors in float32."""
    nearest = np.float32(threshold)
    if float(nearest) > threshold:
        nearest = np.nextafter(nearest, np.float32(-np.inf))
    return float(nearest)


_TOO_FEW = Chosen(boxes=torch.empty(0, 4), scores=torch.empty(0), labels=torch.empty(0, dtype=torch.int64))
