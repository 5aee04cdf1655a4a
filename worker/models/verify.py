"""The rewrites detq makes of a model at load, checked again on a process's first real forwards.

At load, each rewrite (worker.models.sampled_resize: the input resized ahead; worker.models.ssd_postprocess:
an SSD's detections chosen from fewer candidates; worker.models.layout: convolution weights in
channels_last) is kept only where it gives the model's own outputs bit for bit on seeded noise. Noise is
not a photo: a rewrite may meet on real images what the probes never showed it. So a process's first real
forwards run twice, through the rewritten model and through the model as saved (loaded again from its
file, none of the rewrites, the same settings otherwise, on the same images decoded again), and their
detections are compared bit for bit:

- the same: the rewritten model is verified and used on; the model as saved is let go;
- any difference: the model as saved answers from then on, including for the forward that differed, so
  no result of the rewrite that differed is stored; the log says which rewrites and on which image;
- an SSD's detection selection that the probes never exercised (an untrained model's noise answers decline
  it) is used, and checked, until a real forward exercises it and agrees: then verified. One that
  MAX_CHECKED_FORWARDS real forwards never exercise would give no speed: every image then goes through the
  model's own postprocess (decline), the other rewrites verified.

The running of forwards stays with the caller (worker.pipeline): this holds the verdict and the model as
saved, one per loaded model and process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from worker.models.outputs import RawDetections

if TYPE_CHECKING:
    from worker.models.loading import LoadedModel

log = logging.getLogger(__name__)

# Real forwards checked, at most, for a rewrite that must be exercised before it is verified.
MAX_CHECKED_FORWARDS = 8


def same_detections(a: RawDetections, b: RawDetections) -> bool:
    """Bit for bit: the same boxes, labels and scores in the same order."""
    return all(
        x.dtype == y.dtype and x.shape == y.shape and bool(torch.equal(x, y))
        for x, y in ((a.boxes, b.boxes), (a.labels, b.labels), (a.scores, b.scores))
    )


@dataclass
class RewriteCheck:
    """One loaded model's rewrites, pending until real forwards verify them or the model as saved takes
    over (fell_back). needs_exercise: a rewrite the probes did not exercise, verified only once a real
    forward has (exercised_by: how many images it has acted on so far, read before and after a forward)."""

    name: str  # the model file's name, for the log
    rewrites: tuple[str, ...]
    load_as_saved: Callable[[], LoadedModel]
    needs_exercise: bool = False
    exercised_by: Callable[[], int] | None = None
    decline: Callable[[], None] | None = None  # leaves the rewrite that needs exercising off
    verdict: str | None = None  # None while pending
    checked_forwards: int = 0
    as_saved: LoadedModel | None = None  # loaded at the first check; kept only after a fallback

    @property
    def pending(self) -> bool:
        """Real forwards are still to be checked."""
        return self.verdict is None

    @property
    def fell_back(self) -> bool:
        """The model as saved answers instead of the rewritten one."""
        return self.verdict is not None and self.as_saved is not None

    def exercised(self) -> int:
        """How many images the rewrite that needs exercising has acted on so far (0 where none needs it)."""
        return self.exercised_by() if self.exercised_by is not None else 0

    def reference(self) -> LoadedModel:
        """The model as saved, loaded once (a second copy only while checks are pending or after a
        fallback)."""
        if self.as_saved is None:
            self.as_saved = self.load_as_saved()
        return self.as_saved

    def judge(
        self,
        found: Sequence[RawDetections],
        expected: Sequence[RawDetections | None],
        paths: Sequence[str],
        exercised: bool,
    ) -> bool:
        """Record one real forward's comparison: the rewritten model's detections (found) against the model
        as saved's (expected; None where its forward failed), image by image; exercised: whether the
        rewrite needing it acted on this forward. Returns whether they were the same (where not, the caller
        stores expected)."""
        self.checked_forwards += 1
        rewrites = ", ".join(self.rewrites)
        for path, got, wanted in zip(paths, found, expected, strict=True):
            if wanted is None or not same_detections(got, wanted):
                self.verdict = (
                    f"{rewrites}: other detections than the model as saved on a real image ({path}); "
                    "the model as saved answers in this process"
                )
                log.warning("detq: %s: %s", self.name, self.verdict)
                return False
        if exercised or not self.needs_exercise:
            self.verdict = f"{rewrites}: the same detections on {self.checked_forwards} real forwards"
            self.as_saved = None  # let the second copy go
            log.info("detq: %s: %s", self.name, self.verdict)
        elif self.checked_forwards >= MAX_CHECKED_FORWARDS:
            if self.decline is not None:
                self.decline()
            self.verdict = (
                f"{rewrites}: the same detections on {self.checked_forwards} real forwards, none of which "
                "used the selection (no speed to gain): every image through the model's own postprocess"
            )
            self.as_saved = None
            log.info("detq: %s: %s", self.name, self.verdict)
        return True


def exercised_count(module: Any) -> Callable[[], int] | None:
    """How to read how many images an SSD's detection selection chose for (None for other modules)."""
    if not hasattr(module, "chosen_here"):
        return None
    return lambda: int(module.chosen_here)


def declining(module: Any) -> Callable[[], None] | None:
    """How to send every image of an SSD through its own postprocess (None for other modules)."""
    if not hasattr(module, "force_reference"):
        return None

    def decline() -> None:
        module.force_reference = True

    return decline
