"""A scripted torchvision SSD or SSDlite run with its postprocess's choice made by worker.models.ssd_select:
the same detections, bit for bit, checked at load on probe images.

The model's own transform, backbone, head, anchors and box decoding run inside a small TorchScript module
(its ImageList and BoxCoder never reach Python), then each image's detections are chosen by SsdSelection,
or by the model's own postprocess_detections where that declines, and the model's own transform scales
them back to the image.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torchvision.ops import boxes as box_ops

from worker.models.outputs import same_outputs, torchvision_detections
from worker.models.ssd_select import PER_CLASS_NMS_ABOVE, SsdSelection

log = logging.getLogger(__name__)

Size = tuple[int, int]
# Seeded-noise probe sizes (height, width) for the check at load; the model resizes them to its fixed size.
PROBE_SIZES = ((480, 640), (320, 320), (960, 1280))


class _Heads(torch.nn.Module):
    """The model's forward up to its postprocess: class scores, decoded boxes and what the fallback needs."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, images: list[torch.Tensor]
    ) -> tuple[
        torch.Tensor,
        list[torch.Tensor],
        torch.Tensor,
        torch.Tensor,
        list[torch.Tensor],
        list[Size],
        list[Size],
    ]:
        original: list[tuple[int, int]] = []
        for image in images:
            size = image.shape[-2:]
            original.append((size[0], size[1]))
        batch, _ = self.model.transform(images, None)
        features = list(self.model.backbone(batch.tensors).values())
        head = self.model.head(features)
        anchors = self.model.anchor_generator(batch, features)
        scores = torch.nn.functional.softmax(head["cls_logits"], dim=-1)
        boxes: list[torch.Tensor] = []
        for i in range(len(anchors)):  # TorchScript has no zip(strict=...)
            decoded = self.model.box_coder.decode_single(head["bbox_regression"][i], anchors[i])
            boxes.append(box_ops.clip_boxes_to_image(decoded, batch.image_sizes[i]))
        return (
            scores,
            boxes,
            head["bbox_regression"],
            head["cls_logits"],
            anchors,
            batch.image_sizes,
            original,
        )


class SelectedSsd(torch.nn.Module):
    """The model, its detections chosen by SsdSelection where that is exact; returns torchvision's list of
    dicts. force_reference: every image through the model's own postprocess (the check at load)."""

    def __init__(self, model: Any, heads: Any, selection: SsdSelection) -> None:
        super().__init__()
        self.model = model
        self.heads = heads
        self.selection = selection
        self.force_reference = False
        self.chosen_here = 0  # images whose detections SsdSelection chose (the check requires some)

    def with_heads(self, heads: Any) -> SelectedSsd:
        """The same selection over other heads (the frozen and optimised ones of DETQ_CPU_OPTIMIZE)."""
        return SelectedSsd(self.model, heads, self.selection)

    @property
    def transform(self) -> Any:
        """The model's transform (worker.models.introspect reads its size)."""
        return self.model.transform

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        scores, boxes, codes, logits, anchors, sizes, original = self.heads(images)
        found: list[dict[str, torch.Tensor]] = []
        for i in range(len(images)):
            chosen = None if self.force_reference else self.selection.select(scores[i], boxes[i])
            if chosen is None:
                head = {"bbox_regression": codes[i : i + 1], "cls_logits": logits[i : i + 1]}
                found.append(self.model.postprocess_detections(head, [anchors[i]], [sizes[i]])[0])
            else:
                self.chosen_here += 1
                found.append({"boxes": chosen.boxes, "scores": chosen.scores, "labels": chosen.labels})
        return list(self.model.transform.postprocess(found, sizes, original))


def selection_of(module: Any) -> SsdSelection | None:
    """An SSD's postprocess settings, or None for any other model, or for one whose batched_nms does not
    run one NMS a class above 4,000 box coordinates on a CPU (torchvision before 0.10 always shifted boxes
    apart by class instead, whose float arithmetic differs)."""
    if getattr(module, "original_name", None) != "SSD" or not _nms_by_class(module):
        return None
    try:
        return SsdSelection(
            score_thresh=float(module.score_thresh),
            topk_candidates=int(module.topk_candidates),
            nms_thresh=float(module.nms_thresh),
            detections_per_img=int(module.detections_per_img),
        )
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None


def _nms_by_class(module: Any) -> bool:
    """Whether the model's postprocess, its calls inlined, holds batched_nms's CPU cut (4,000) and an NMS."""
    try:
        graph = module.postprocess_detections.graph.copy()
        torch._C._jit_pass_inline(graph)
    except (AttributeError, RuntimeError):
        return False
    text = str(graph)
    return f"prim::Constant[value={PER_CLASS_NMS_ABOVE}]()" in text and "torchvision::nms" in text


def probe_images() -> list[torch.Tensor]:
    """Seeded noise at PROBE_SIZES, as the model's input floats."""
    generator = torch.Generator().manual_seed(20261204)
    return [torch.rand(3, h, w, generator=generator) for h, w in PROBE_SIZES]


def select_detections(module: Any, name: str) -> tuple[Any, str]:
    """The module wrapped in SelectedSsd where, on the probes, both its choices and its fallback give the
    model's own outputs bit for bit (where the probes never reach its choices, its chosen_here stays 0:
    real forwards verify it, worker.models.verify); else the module as it was. Returns it and a note (""
    for other models)."""
    selection = selection_of(module)
    if selection is None:
        return module, ""
    try:
        with warnings.catch_warnings():
            # TorchScript's notes on the model's own code, and scripted SSD's on every call
            warnings.simplefilter("ignore")
            wrapped = SelectedSsd(module, torch.jit.script(_Heads(module).eval()), selection)
            probes = probe_images()
            with torch.inference_mode():
                expected = torchvision_detections(module(probes))
                same = same_outputs(torchvision_detections(wrapped(probes)), expected)
                wrapped.force_reference = True
                same = same and same_outputs(torchvision_detections(wrapped(probes)), expected)
                wrapped.force_reference = False
    except Exception as exc:  # noqa: BLE001 - any failure leaves the model as it was
        log.warning("detq: %s's postprocess cannot be taken over, leaving it to the model: %s", name, exc)
        return module, f"selected detections: fails here ({type(exc).__name__}), left to the model"
    if not same:
        return module, "selected detections: would change the detections, left to the model"
    if wrapped.chosen_here == 0:
        return wrapped, (
            "selected detections: not exercised by the probes, checked on real forwards until one "
            "exercises it (worker.models.verify)"
        )
    return wrapped, (
        f"selected detections: {name}'s detections chosen from only the candidates that can reach them "
        "(the same detections, checked on probes)"
    )
