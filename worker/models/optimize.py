"""Freeze a TorchScript model and optimise it for CPU inference: opt-in, as its scores move by about 1e-6;
kept only where it runs faster than the model as it was."""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from worker.models.ssd_postprocess import SelectedSsd

log = logging.getLogger(__name__)

# The optimised graph is kept only when its median forward is at least this much faster than the original.
MIN_GAIN = 0.05
# Calls of each before timing (TorchScript's profiling executor specialises a graph on its first runs),
# then timed calls of each, alternated so that a change in the machine's load hits both alike.
WARM_CALLS, TIMED_CALLS = 2, 3


def optimized_for_cpu(module: Any, name: str) -> tuple[Any, str]:
    """(module, note): torch.jit.freeze then optimize_for_inference (weights folded into the graph,
    convolutions fused with their batch norms and activations, MKL-DNN layouts), or the module as it was
    and why not. Only TorchScript can be frozen; a torch.export program is left as it is. Of an SSD whose
    detections detq selects (worker.models.ssd_postprocess), the part up to its postprocess."""
    if isinstance(module, SelectedSsd):  # its heads hold the weights; its choice of detections stays as it is
        heads, note = optimized_for_cpu(module.heads, name)
        return (module if heads is module.heads else module.with_heads(heads)), note
    if not isinstance(module, torch.jit.ScriptModule):
        return module, "DETQ_CPU_OPTIMIZE: not TorchScript, left as it is"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="`torch.jit", category=FutureWarning)
            frozen = torch.jit.freeze(module.eval())
            return torch.jit.optimize_for_inference(frozen), "DETQ_CPU_OPTIMIZE: frozen and optimised"
    except Exception as exc:  # noqa: BLE001 - an unusual graph the passes cannot handle still runs as it was
        log.warning("detq: %s cannot be frozen for CPU inference, running it as it is: %s", name, exc)
        return module, f"DETQ_CPU_OPTIMIZE: cannot be frozen ({type(exc).__name__}), left as it is"


def alternated_medians(
    calls: Sequence[Callable[[], object]],
    clock: Callable[[], float] = time.perf_counter,
    *,
    warm: int = WARM_CALLS,
    timed: int = TIMED_CALLS,
    enter: Callable[[int], None] | None = None,
) -> list[float]:
    """Median seconds of each call: `warm` rounds, then `timed` rounds, each round calling every one in
    turn, so that a change in the machine's load hits them alike. enter(i), untimed, comes before each
    call of calls[i] (to switch what that call runs)."""

    def seconds(index: int) -> float:
        if enter is not None:
            enter(index)
        began = clock()
        calls[index]()
        return clock() - began

    for _ in range(warm):
        for index in range(len(calls)):
            seconds(index)
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(timed):
        for index in range(len(calls)):
            times[index].append(seconds(index))
    return [statistics.median(each) for each in times]


def faster_of(
    original: Any,
    optimized: Any,
    run: Callable[[Any], object],
    name: str,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Any, str]:
    """(module, note): the optimised module if its forward (run) is at least MIN_GAIN faster, else the
    original. The passes do not always pay: on a YOLOv8n export Ultralytics had already fused, the frozen
    graph ran at 0.7x on 2 cores (docs/benchmarks.md), while SSDlite gained."""
    if optimized is original:
        return original, ""
    before, after = alternated_medians([lambda: run(original), lambda: run(optimized)], clock)
    verdict = f"{before * 1000:.0f} ms a forward as it was, {after * 1000:.0f} ms optimised"
    if after <= before * (1 - MIN_GAIN):
        return optimized, f"DETQ_CPU_OPTIMIZE: kept the optimised graph ({verdict})"
    log.warning("detq: DETQ_CPU_OPTIMIZE does not speed up %s here (%s); running it as it was", name, verdict)
    return original, f"DETQ_CPU_OPTIMIZE: no faster here, left as it was ({verdict})"
