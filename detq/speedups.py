"""Every speed-up detq applies, in one place: what it does, where it applies, how it is kept honest, what it
gained where measured, and the setting that turns it off. `DETQ_AS_SAVED=true` (`--as-saved`) turns them
all off: the model as its file has it, one image a forward, pool processes untuned.

The code of each lives where the list says (`module`); this list is what `load_configured`, the pool
processes' start-up, `detq model inspect` and docs/models.md ("Speed-ups") read. Two sorts:

- **exact** ones are on by default: each is checked against the model as saved where it could change an
  answer (bit for bit on probes at load, and again on a process's first real forwards) and dropped where
  it would, so a stored result stays the model's own.
- **trades** are opt-in: they move pixels or arithmetic a little (docs/models.md, "What each opt-in trades").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Speedup:
    """One speed-up, declared."""

    name: str
    switch: str  # the Settings field that turns it on or off (DETQ_<SWITCH>)
    off: Any  # the switch's value that turns it off
    exact: bool  # True: checked against the model as saved and dropped where it differs
    applies: str  # when it applies
    verified: str  # how its answers are kept the model's
    gain: str  # what it gained, where measured (docs/benchmarks.md)
    module: str  # where its code lives

    @property
    def variable(self) -> str:
        """Its switch as an environment variable."""
        return f"DETQ_{self.switch.upper()}"


SPEEDUPS: tuple[Speedup, ...] = (
    Speedup(
        name="micro-batches",
        switch="micro_batch",
        off=1,
        exact=True,
        applies="every model; on a CPU forwards of at most DETQ_CPU_FORWARD_PIXELS of input",
        verified=(
            "images share a forward only under a rule by which each is padded as when alone, checked at"
            " load on a probe alone and beside a batch-mate; the next stricter rule where they differ"
        ),
        gain="SSDlite on 1280x960 photos, 2 a forward against 1: median 25.9 against 24.5 images/s",
        module="worker/models/batching.py",
    ),
    Speedup(
        name="sampled resize",
        switch="cpu_sampled_resize",
        off=False,
        exact=True,
        applies="CPU, fp32, TorchScript: a fixed-size torchvision detector (SSD, SSDlite)",
        verified="the same input floats as its own transform on probes; detections again on real forwards",
        gain="SSDlite, 12 MP photos: 22.6 against 13.7 images/s with the load rewrites off (1.65x)",
        module="worker/models/sampled_resize.py",
    ),
    Speedup(
        name="selected detections",
        switch="cpu_selected_detections",
        off=False,
        exact=True,
        applies="CPU, fp32, TorchScript: a torchvision SSD or SSDlite",
        verified="its detections bit for bit on probes at load, and again on real forwards",
        gain="calibrated SSDlite, eight 1280x960 photos a forward: 58.9 against 108.9 ms an image (1.85x)",
        module="worker/models/ssd_select.py",
    ),
    Speedup(
        name="channels_last",
        switch="cpu_channels_last",
        off=False,
        exact=True,
        applies="CPU, fp32: a model whose every forward has one input shape",
        verified="outputs bit for bit on probe images at 1 and a micro-batch, kept only where faster",
        gain="1.05x to 1.13x a forward on a flat SSDlite; none of the bench's models keeps it",
        module="worker/models/layout.py",
    ),
    Speedup(
        name="frozen graph",
        switch="cpu_optimize",
        off=False,
        exact=False,
        applies="opt-in; CPU, fp32, TorchScript: torch.jit.freeze and optimize_for_inference",
        verified="timed at load and kept only where 5% faster; scores move by about 1e-7",
        gain="SSDlite 1280x960: 24.4 against 22.0 images/s; a YOLOv8n export runs 0.7x, so it is refused",
        module="worker/models/optimize.py",
    ),
    Speedup(
        name="reduced JPEG decode",
        switch="fast_decode",
        off=False,
        exact=False,
        applies="opt-in, recorded on the job: a JPEG at least twice the model's input, at a DCT scale",
        verified="none: pixels differ, boxes move by up to 3 to 6 px (docs/models.md)",
        gain="SSDlite, 12 MP photos: 19.8 against 4.5 images/s",
        module="worker/decode.py",
    ),
    Speedup(
        name="large buffers kept",
        switch="process_tuning",
        off=False,
        exact=True,
        applies="pool processes on glibc: buffers up to 1 GB from the heap, kept while at work",
        verified="no answer depends on it; the heap is given back once the process idles",
        gain="YOLOv8n export, 12 MP photos: 7.3 against 5.3 images/s (1.38x)",
        module="worker/allocator.py",
    ),
    Speedup(
        name="collector frozen",
        switch="process_tuning",
        off=False,
        exact=True,
        applies="pool processes: what start-up made is moved out of the garbage collector's sight",
        verified="no answer depends on it",
        gain="a process's first batch no longer pays a 0.2 s full collection of about 430,000 objects",
        module="worker/bootstrap.py",
    ),
)

# Commands (`detq enqueue`, `detq status`...) collect garbage less often during their imports (gc's
# thresholds, set first thing in cli.main.main) and freeze what the imports made (DetqCommand.invoke):
# 45-70 ms of a 0.4-0.5 s `detq enqueue` became about 20. It runs before any setting is read and changes no
# output, so it has no switch; it is named here so that the list is whole.
COMMAND_GC_THRESHOLDS = (10_000, 50, 100)


def as_saved_values() -> dict[str, Any]:
    """The settings that turn every speed-up off (what DETQ_AS_SAVED folds in)."""
    return {speedup.switch: speedup.off for speedup in SPEEDUPS}


def off_by_settings(values: Any) -> list[Speedup]:
    """The speed-ups these settings turn off (an object with the switches as attributes)."""
    return [speedup for speedup in SPEEDUPS if getattr(values, speedup.switch) == speedup.off]
