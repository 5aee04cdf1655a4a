"""SsdSelection against torchvision's own SSD.postprocess_detections, run on the same head outputs: the same
detections bit for bit wherever it answers, and no answer where the reference's sort decides an order."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.ssd import SSD
from torchvision.ops import boxes as box_ops

from worker.models import ssd_select
from worker.models.ssd_select import Chosen, SsdSelection, below

ANCHORS, CLASSES, SIZE = 3234, 91, (320, 320)
SSDLITE = SsdSelection(score_thresh=0.001, topk_candidates=300, nms_thresh=0.55, detections_per_img=300)


def _anchors(generator: torch.Generator) -> torch.Tensor:
    """SSD-like anchors: centres on a grid over 320 x 320, widths and heights from 10 to 200."""
    centres = torch.rand(ANCHORS, 2, generator=generator) * 320
    sizes = 10 + torch.rand(ANCHORS, 2, generator=generator) * 190
    return torch.cat([centres - sizes / 2, centres + sizes / 2], dim=1)


def _reference(
    codes: torch.Tensor, logits: torch.Tensor, anchors: torch.Tensor, selection: SsdSelection
) -> Chosen:
    """torchvision's SSD.postprocess_detections on one image's head outputs."""
    owner = SimpleNamespace(
        box_coder=det_utils.BoxCoder(weights=(10.0, 10.0, 5.0, 5.0)),
        score_thresh=selection.score_thresh,
        topk_candidates=selection.topk_candidates,
        nms_thresh=selection.nms_thresh,
        detections_per_img=selection.detections_per_img,
    )
    head = {"bbox_regression": codes[None], "cls_logits": logits[None]}
    found = SSD.postprocess_detections(owner, head, [anchors], [SIZE])[0]  # type: ignore[arg-type]
    return Chosen(boxes=found["boxes"], scores=found["scores"], labels=found["labels"])


def _selected(
    codes: torch.Tensor, logits: torch.Tensor, anchors: torch.Tensor, selection: SsdSelection
) -> Chosen | None:
    """SsdSelection on the same head outputs, decoded and clipped as the reference does."""
    scores = F.softmax(logits[None], dim=-1)[0]
    boxes = det_utils.BoxCoder(weights=(10.0, 10.0, 5.0, 5.0)).decode_single(codes, anchors)
    return selection.select(scores, box_ops.clip_boxes_to_image(boxes, SIZE))


def _same(a: Chosen, b: Chosen) -> bool:
    return (
        torch.equal(a.boxes, b.boxes)
        and torch.equal(a.scores, b.scores)
        and torch.equal(a.labels, b.labels)
        and a.labels.dtype == b.labels.dtype == torch.int64
    )


Case = Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def _spread(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Every class above the threshold at every anchor, scores all different (a random-weight model)."""
    return torch.randn(ANCHORS, 4, generator=g) * 0.5, torch.randn(ANCHORS, CLASSES, generator=g) * 0.3


def _trained(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Background dominant, a few confident objects, most class scores under the threshold."""
    logits = torch.randn(ANCHORS, CLASSES, generator=g) * 1.5
    logits[:, 0] += 6.0
    hits = torch.randint(0, ANCHORS, (40,), generator=g)
    logits[hits, torch.randint(1, CLASSES, (40,), generator=g)] += 12.0
    return torch.randn(ANCHORS, 4, generator=g) * 0.3, logits


def _crowded(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One class scoring highest everywhere over boxes that overlap: most of its candidates suppressed,
    so the first take holds too few survivors and more are taken."""
    codes, logits = _spread(g)
    logits[:, 7] += 4.0
    return torch.zeros(ANCHORS, 4), logits


@pytest.mark.parametrize("case", [_spread, _trained, _crowded], ids=["spread", "trained", "crowded"])
@pytest.mark.parametrize("seed", range(6))
def test_the_same_detections_as_torchvision(case: Case, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    anchors = _anchors(g)
    codes, logits = case(g)
    chosen = _selected(codes, logits, anchors, SSDLITE)
    assert chosen is not None, "distinct scores: the selection should answer"
    reference = _reference(codes, logits, anchors, SSDLITE)
    assert reference.scores.numel() > 0
    assert _same(chosen, reference)


def test_the_crowded_case_takes_more_candidates_than_the_first_take(monkeypatch: pytest.MonkeyPatch) -> None:
    takes: list[int] = []
    original = torch.Tensor.topk

    def counted(self: torch.Tensor, k: int, *args: object, **kwargs: object) -> object:
        if self.dim() == 1 and self.numel() == ANCHORS * (CLASSES - 1):
            takes.append(k)
        return original(self, k, *args, **kwargs)  # type: ignore[arg-type]

    g = torch.Generator().manual_seed(3)
    anchors = _anchors(g)
    codes, logits = _crowded(g)
    monkeypatch.setattr(torch.Tensor, "topk", counted)
    chosen = _selected(codes, logits, anchors, SSDLITE)
    monkeypatch.undo()
    assert chosen is not None and _same(chosen, _reference(codes, logits, anchors, SSDLITE))
    assert takes[0] == ssd_select.FIRST_TAKE_PER_DETECTION * SSDLITE.detections_per_img
    assert len(takes) > 1 and takes[-1] > takes[0]


@pytest.mark.parametrize("seed", range(4))
def test_other_settings_match_too(seed: int) -> None:
    """A stricter model: fewer candidates a class, fewer detections, another overlap threshold."""
    selection = SsdSelection(score_thresh=0.01, topk_candidates=100, nms_thresh=0.45, detections_per_img=50)
    g = torch.Generator().manual_seed(100 + seed)
    anchors = _anchors(g)
    codes, logits = _spread(g)
    chosen = _selected(codes, logits, anchors, selection)
    assert chosen is not None
    assert _same(chosen, _reference(codes, logits, anchors, selection))


def test_every_score_equal_leaves_it_to_the_reference() -> None:
    """SSDlite built with weights=None scores 1/91 everywhere: its order is its sorts' tie-break."""
    g = torch.Generator().manual_seed(0)
    assert _selected(torch.zeros(ANCHORS, 4), torch.zeros(ANCHORS, CLASSES), _anchors(g), SSDLITE) is None


def test_equal_scores_in_a_class_leave_it_to_the_reference() -> None:
    g = torch.Generator().manual_seed(1)
    anchors = _anchors(g)
    codes, logits = _spread(g)
    best = int(logits[:, 5].argmax())
    logits[(best + 1) % ANCHORS] = logits[best]  # a second anchor with the best one's scores in every class
    assert _selected(codes, logits, anchors, SSDLITE) is None


def test_equal_scores_across_classes_among_candidates_are_fine() -> None:
    """Equal scores in different classes never meet in one NMS; only the survivors' order could see them."""
    g = torch.Generator().manual_seed(2)
    anchors = _anchors(g)
    codes, logits = _spread(g)
    logits[:, 2], logits[:, 3] = logits[:, 1], logits[:, 1]
    codes[:, :] = 0.0
    chosen = _selected(codes, logits, anchors, SSDLITE)
    reference = _reference(codes, logits, anchors, SSDLITE)
    assert chosen is None or _same(chosen, reference)


def test_few_candidates_leave_it_to_the_reference() -> None:
    """1,000 candidates or fewer: torchvision's batched_nms shifts boxes apart by class instead."""
    g = torch.Generator().manual_seed(4)
    anchors = _anchors(g)
    codes, logits = _trained(g)
    logits[:, 0] += 20.0  # the background takes nearly everything
    logits[:10, 1] = 40.0
    assert _selected(codes, logits, anchors, SSDLITE) is None


def test_boxes_that_are_not_finite_leave_it_to_the_reference() -> None:
    g = torch.Generator().manual_seed(5)
    anchors = _anchors(g)
    codes, logits = _spread(g)
    scores = F.softmax(logits, dim=-1)
    boxes = det_utils.BoxCoder(weights=(10.0, 10.0, 5.0, 5.0)).decode_single(codes, anchors)
    boxes[17, 2] = float("nan")
    assert SSDLITE.select(scores, boxes) is None


@pytest.mark.parametrize("threshold", [0.55, 0.45, 0.5, 0.3, 1 / 3])
def test_below_compares_as_a_double_would(threshold: float) -> None:
    at = np.float32(threshold)
    near = [np.nextafter(at, np.float32(-1)), at, np.nextafter(at, np.float32(2))]
    values = torch.tensor(np.array(near, dtype=np.float32))
    assert (values > below(threshold)).tolist() == [float(v) > threshold for v in near]


def test_scores_that_are_not_float32_leave_it_to_the_reference() -> None:
    g = torch.Generator().manual_seed(6)
    anchors = _anchors(g)
    codes, logits = _spread(g)
    scores = F.softmax(logits, dim=-1)
    boxes = box_ops.clip_boxes_to_image(
        det_utils.BoxCoder(weights=(10.0, 10.0, 5.0, 5.0)).decode_single(codes, anchors), SIZE
    )
    assert SSDLITE.select(scores, boxes) is not None
    assert SSDLITE.select(scores.double(), boxes.double()) is None
