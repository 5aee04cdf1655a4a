"""The benchmark's table (with ratios), its JSON and its chart."""

from __future__ import annotations

import json
import platform
import statistics
from pathlib import Path
from typing import Any

NAIVE, CEILING, RAY = "naive loop", "in-process ceiling", "Ray Data"
# The mixed-hardware extra (bench/mixed.py): its JSON key, and the configuration the others are held to.
MIXED, FAST_ALONE = "mixed_pools_images_per_s", "fast alone"
# The JSON's keys for the detq runners' split of each run: seconds from the launch of `detq enqueue` to
# the first claimed image, and images/s from then to the last finished one.
START_UPS, AFTER_CLAIM = "detq_start_up_s", "detq_images_per_s_after_first_claim"


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}x" if base else "-"


def round_by_round(rates: list[float], base: list[float] | None) -> str:
    """The median of a runner's ratios to base taken round by round (each round ran every runner in turn,
    so a pair shares the machine's state), with their range; "-" without a base."""
    pairs = [rate / other for rate, other in zip(rates, base or [], strict=False) if other > 0]
    if not pairs:
        return "-"
    return f"{statistics.median(pairs):.2f}x ({min(pairs):.2f}-{max(pairs):.2f})"


def table(results: dict[str, dict[str, list[float]]]) -> str:
    """Markdown: per workload, each runner's images/s (every run, best), against the naive loop, the
    ceiling and Ray Data (best against best: every runner ran interleaved in the same invocation), and
    against the ceiling round by round (the median ratio of runs made back to back, and its range)."""
    lines = [
        "| workload | runner | images/s (runs) | best | vs naive | vs ceiling | vs Ray Data "
        "| vs ceiling, round by round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload, runners in results.items():
        best = {name: max(rates) for name, rates in runners.items() if rates}
        for name, rates in runners.items():
            runs = ", ".join(f"{r:.1f}" for r in rates)
            lines.append(
                f"| {workload} | {name} | {runs} | {best[name]:.1f} | {_ratio(best[name], best.get(NAIVE))} "
                f"| {_ratio(best[name], best.get(CEILING))} | {_ratio(best[name], best.get(RAY))} "
                f"| {round_by_round(rates, runners.get(CEILING))} |"
            )
    return "\n".join(lines)


def start_up_table(report: dict[str, Any]) -> str:
    """Markdown: each detq run split at its first claimed image, the time before it (the enqueue
    command's start-up, its rows and sends) and the pace after it, against the ceiling round by round;
    empty when no detq runner ran."""
    start_ups: dict[str, dict[str, list[float]]] = report.get(START_UPS, {})
    after: dict[str, dict[str, list[float]]] = report.get(AFTER_CLAIM, {})
    lines = [
        "| workload | runner | start-up, s (runs) | images/s after the first claim (runs) "
        "| after the first claim vs ceiling, round by round |",
        "|---|---|---|---|---|",
    ]
    for workload, runners in start_ups.items():
        ceiling = report["images_per_s"].get(workload, {}).get(CEILING)
        for name, seconds in runners.items():
            rates = after.get(workload, {}).get(name, [])
            lines.append(
                f"| {workload} | {name} | {', '.join(f'{s:.2f}' for s in seconds)} "
                f"| {', '.join(f'{r:.1f}' for r in rates)} | {round_by_round(rates, ceiling)} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def mixed_table(report: dict[str, Any]) -> str:
    """Markdown: each mixed-hardware configuration's images/s against the normal worker alone, round by
    round (every round ran the three in turn); empty when the extra did not run."""
    runs: dict[str, list[float]] = report.get(MIXED, {})
    lines = [
        "| mixed hardware | images/s (runs) | vs the fast worker alone, round by round |",
        "|---|---|---|",
    ]
    for name, rates in runs.items():
        ratio = "1.00x" if name == FAST_ALONE else round_by_round(rates, runs.get(FAST_ALONE))
        lines.append(f"| {name} | {', '.join(f'{r:.1f}' for r in rates)} | {ratio} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def machine() -> dict[str, Any]:
    import os

    import torch

    return {
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def write(out: Path, report: dict[str, Any]) -> None:
    """bench.json, bench.md (the table) and, with matplotlib, bench.png."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    tables = [table(report["images_per_s"]), start_up_table(report), mixed_table(report)]
    (out / "bench.md").write_text("\n\n".join(t for t in tables if t) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    workloads = report["images_per_s"]
    if not workloads:  # a run of extras alone (--images 0 --large-images 0): nothing to chart
        return
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for axis, (workload, runners) in zip(axes[0], workloads.items(), strict=True):
        names = [n for n, rates in runners.items() if rates]
        axis.barh(names, [max(runners[n]) for n in names], color="#4c72b0")
        axis.set_title(workload)
        axis.set_xlabel("images/s (best run)")
        axis.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out / "bench.png", dpi=100)
    plt.close(fig)
