"""How far two answers for one image agree: boxes matched one to one, and the largest differences left.

One measure for every comparison detq makes of a model with itself: a forward alone against one in a
batch (worker.models.batching, at load), detq's pipeline against the plain loop a user writes (`detq check`,
the suite's fidelity tests). Two answers agree when every box of each is matched to a box of the other of
the same label with an IoU of at least MIN_IOU (or corners within SAME_CORNER, for boxes of no area) and
scores within SCORE_TOLERANCE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchvision.ops import box_iou

from worker.models.outputs import RawDetections

MIN_IOU = 0.99
SCORE_TOLERANCE = 1e-3
SAME_CORNER = 1e-3  # pixels: boxes whose corners are this close match whatever their IoU


@dataclass(frozen=True)
class Agreement:
    """Boxes in the expected and the found answer, how many matched, and the matches' largest gaps."""

    expected: int
    found: int
    matched: int
    max_score_diff: float = 0.0
    max_corner_diff: float = 0.0  # pixels, the largest of any matched box's four coordinates

    @property
    def recall(self) -> float:
        """Matched boxes over the expected ones (1.0 where none were expected)."""
        return self.matched / self.expected if self.expected else 1.0

    @property
    def precision(self) -> float:
        """Matched boxes over the found ones (1.0 where none were found)."""
        return self.matched / self.found if self.found else 1.0

    @property
    def agrees(self) -> bool:
        """Every box matched both ways, every matched score within SCORE_TOLERANCE."""
        return self.matched == self.expected == self.found and self.max_score_diff <= SCORE_TOLERANCE


def agreement(expected: RawDetections, found: RawDetections, min_iou: float = MIN_IOU) -> Agreement:
    """Match found boxes to expected ones, one to one: in the expected answer's score order, each takes the
    unmatched found box of its label that overlaps it most (at least min_iou), the closer score on a tie."""
    count_e, count_f = int(expected.boxes.shape[0]), int(found.boxes.shape[0])
    if not count_e or not count_f:
        return Agreement(expected=count_e, found=count_f, matched=0)
    boxes_e, boxes_f = expected.boxes.to(torch.float64), found.boxes.to(torch.float64)
    scores_e, scores_f = expected.scores.to(torch.float64), found.scores.to(torch.float64)
    corner_gap = (boxes_e[:, None, :] - boxes_f[None, :, :]).abs().amax(dim=2)
    # Boxes of no area (an untrained head's, or clipped at an edge) have no IoU: the same corners match.
    overlap = torch.where(corner_gap <= SAME_CORNER, 1.0, box_iou(boxes_e, boxes_f).nan_to_num(0.0))
    overlap[expected.labels[:, None] != found.labels[None, :]] = -1.0
    score_gap = (scores_e[:, None] - scores_f[None, :]).abs()
    taken = torch.zeros(count_f, dtype=torch.bool)
    matched, worst_score, worst_corner = 0, 0.0, 0.0
    for row in torch.argsort(scores_e, descending=True, stable=True).tolist():
        candidates = (overlap[row] >= min_iou) & ~taken
        if not bool(candidates.any()):
            continue
        # The highest overlap first; among overlaps that equal, the closest score.
        ranked = torch.where(candidates, overlap[row] - score_gap[row] * 1e-9, torch.tensor(-2.0))
        col = int(torch.argmax(ranked))
        taken[col] = True
        matched += 1
        worst_score = max(worst_score, float(score_gap[row, col]))
        worst_corner = max(worst_corner, float(corner_gap[row, col]))
    return Agreement(count_e, count_f, matched, worst_score, worst_corner)
