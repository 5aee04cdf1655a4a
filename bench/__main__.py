"""`make bench`: every runner on the same photos and models, interleaved, in one invocation.

python -m bench [--images 240] [--large-images 192] [--repeat 2] [--models ssdlite,yolov8] [--no-ray]
                [--enqueue-files 100000] [--only naive,ceiling,opt] [--skip mixed,overhead,writes,scale]
                [--scale-sizes 10000,100000,1000000]
                [--out bench-results]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from bench import deployments, enqueue, loops, mixed, ray_data, scale, tables, writes
from bench.photos import write_photos
from tests.support import save_fixed_box_model, save_torchvision_detector

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"1280x960": (1280, 960), "12MP": (4000, 3000)}
YOLO_CLASS_BIAS = "-3.5"  # a few boxes an image, where SSDlite's random weights give 300
FAST_DECODE = {"DETQ_FAST_DECODE": "true"}
CPU_OPTIMIZE = {"DETQ_CPU_OPTIMIZE": "true"}
OPT_INS = {**FAST_DECODE, **CPU_OPTIMIZE}
# The default's exact rewrites at load off (the layout of the weights, the sampled resize): what they buy.
AS_SAVED = {
    "DETQ_CPU_CHANNELS_LAST": "false",
    "DETQ_CPU_SAMPLED_RESIZE": "false",
    "DETQ_CPU_SELECTED_DETECTIONS": "false",
}


def build_models(work: Path, names: list[str]) -> dict[str, Path]:
    """SSDlite (scripted torchvision, random weights: 300 boxes an image), a YOLOv8n export at 640.

    ssdlite has its BatchNorm statistics taken from noise images, so its scores differ as a trained
    model's do; ssdlite-flat is as built, every anchor scoring 1/91 in every class (the workload until the
    sixteenth session, which detq's selected detections leave to the model's own postprocess)."""
    models: dict[str, Path] = {}
    if "ssdlite" in names:
        models["ssdlite"] = save_torchvision_detector(work / "ssdlite.pt", "ssdlite", calibrated=True)
    if "ssdlite-flat" in names:
        models["ssdlite-flat"] = save_torchvision_detector(work / "ssdlite-flat.pt", "ssdlite")
    if "yolov8" in names:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-m", "bench.yolo_export", str(work / "yolo"), "640", YOLO_CLASS_BIAS],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        models["yolov8"] = Path(done.stdout.strip().splitlines()[-1])
    return models


Runner = Callable[[], float | deployments.JobRun]


def runners(model: Path, photos: list[Path], folder: Path, work: Path, ray: bool) -> dict[str, Runner]:
    cores = len(os.sched_getaffinity(0))
    extra = {"DETQ_BATCH_SIZE": "8"}
    warm = deployments.warm_up_folder(photos, folder.with_name(f"{folder.name}-warm-up"), cores)

    def scaled_out(settings: dict[str, str]) -> Runner:
        env = {**extra, **settings}
        return lambda: deployments.detq_redis_postgres(model, folder, work, cores, env, warm)

    found: dict[str, Runner] = {
        tables.NAIVE: lambda: loops.naive_loop(model, photos),
        tables.CEILING: lambda: loops.ceiling(model, photos),
        "detq embedded": lambda: deployments.detq_embedded(model, folder, work, cores, extra, warm),
        "detq Redis + PostgreSQL": scaled_out({}),
        # The two opt-ins that change numbers (docs/models.md#exact-preprocessing): what each buys, and both.
        "detq Redis + PostgreSQL, fast decode": scaled_out(FAST_DECODE),
        "detq Redis + PostgreSQL, CPU optimize": scaled_out(CPU_OPTIMIZE),
        "detq Redis + PostgreSQL, opt-ins": scaled_out(OPT_INS),
        "detq Redis + PostgreSQL, model as saved": scaled_out(AS_SAVED),
    }
    if ray:
        found[tables.RAY] = lambda: ray_data.ray_data(model, photos)
    return found


def selected(name: str, wanted: list[str], names: Collection[str]) -> bool:
    """Whether --only picks this runner: every runner when empty; a part naming one runner exactly picks
    only that one ("detq Redis + PostgreSQL" is not also its opt-in variants), any other part every runner
    whose name contains it ("opt")."""
    if not wanted:
        return True
    return any(part == name or (part not in names and part in name) for part in wanted)


def in_round_order(named: dict[str, Runner], round_: int) -> list[tuple[str, Runner]]:
    """The runners of a workload in the order a round runs them: as listed in even rounds, reversed in
    odd ones (ABBA), so that a drift of the machine's speed within a round does not favour the runners
    listed first over the rounds."""
    order = list(named.items())
    return order[::-1] if round_ % 2 else order


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--images", type=int, default=240, help="1280x960 photos per run")
    # Batches of 8 on every core: counts that are multiples of 8 x cores keep every process busy to the end.
    # 192: a 12 MP job should last nearly as long as the 240-photo one, or detq's one-off start-up (the
    # enqueue command, 0.35 to 0.9 s: its Python imports alone 0.45 s here), which the ceiling does not pay
    # and a real folder amortises, weighs more there than at 1280x960. 32 went to 64 when YOLOv8n ran them
    # in 4 s; 64 to 128 when the sampled resize made SSDlite's 64 a job of 3 s (fifteenth session); 128 to
    # 192 when the selected detections made its 128 a job of 5 to 6 s (seventeenth).
    parser.add_argument("--large-images", type=int, default=192, help="12 MP photos per run (0: none)")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--models", default="ssdlite,yolov8", help="of ssdlite, ssdlite-flat, yolov8")
    parser.add_argument("--no-ray", action="store_true", help="skip Ray Data even when installed")
    parser.add_argument(
        "--enqueue-files", type=int, default=100_000, help="files for the enqueue bench (0: none)"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated parts of runner names to run (default: every runner)"
    )
    parser.add_argument(
        "--skip", default="", help="comma-separated extras to skip: mixed, overhead, writes, scale"
    )
    parser.add_argument(
        "--scale-sizes",
        default="10000,100000,1000000",
        help="files queued in the scale table (bench/scale.py), comma-separated",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = parser.parse_args()
    ray = not args.no_ray and ray_data.available()
    started = time.time()
    results: dict[str, dict[str, list[float]]] = {}
    start_ups: dict[str, dict[str, list[float]]] = {}  # detq runners: launch to first claim, s
    after_claim: dict[str, dict[str, list[float]]] = {}  # detq runners: images/s from the first claim
    extras: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="detq-bench-") as tmp:
        work = Path(tmp)
        models = build_models(work, args.models.split(","))
        counts = {"1280x960": args.images, "12MP": args.large_images}
        folders = {size: work / f"photos-{size}" for size, count in counts.items() if count > 0}
        photo_lists = {
            size: write_photos(folder, counts[size], SIZES[size]) for size, folder in folders.items()
        }
        wanted = [part.strip() for part in args.only.split(",") if part.strip()]
        plan = {
            f"{model} {size}": {
                name: run for name, run in every.items() if selected(name, wanted, every.keys())
            }
            for model, path in models.items()
            for size in folders
            for every in [runners(path, photo_lists[size], folders[size], work, ray)]
        }
        for workload, named in plan.items():
            results[workload] = {name: [] for name in named}
            start_ups[workload], after_claim[workload] = {}, {}

        def save() -> dict[str, Any]:  # after every step: a late failure keeps what was measured
            summary = {
                "command": " ".join(["python -m bench", *sys.argv[1:]]),
                "machine": tables.machine(),
                "seconds": round(time.time() - started),
                "images_per_s": _rounded(results),
                tables.START_UPS: _rounded(start_ups, 3),
                tables.AFTER_CLAIM: _rounded(after_claim),
                **extras,
            }
            tables.write(args.out, summary)
            return summary

        for round_ in range(args.repeat):  # interleaved: a drift in machine load hits every runner alike
            for workload, named in plan.items():
                for name, run in in_round_order(named, round_):
                    outcome = run()
                    rate = outcome.rate if isinstance(outcome, deployments.JobRun) else outcome
                    results[workload][name].append(rate)
                    line = f"round {round_ + 1} {workload} {name}: {rate:.1f} images/s"
                    if isinstance(outcome, deployments.JobRun):
                        start_ups[workload].setdefault(name, []).append(outcome.start_up_s)
                        after_claim[workload].setdefault(name, []).append(outcome.rate_after_first_claim)
                        after = outcome.rate_after_first_claim
                        line += f"; start-up {outcome.start_up_s:.2f} s, then {after:.1f} images/s"
                    print(line, flush=True)
            save()
        skip = {part.strip() for part in args.skip.split(",")}
        if "mixed" not in skip and "ssdlite" in models and "1280x960" in folders:
            extras[tables.MIXED] = mixed_bench(models["ssdlite"], folders["1280x960"], work, args.repeat)
            save()
        if "overhead" not in skip:
            extras.update(framework_overhead(work, args.repeat))
            ceiling = results.get("ssdlite 1280x960", {}).get(tables.CEILING)
            if ceiling:  # an SSDlite batch of 8 on one process, at the ceiling's best rate
                batch_ms = 1000 * 8 * len(os.sched_getaffinity(0)) / max(ceiling)
                extras["framework_share_of_ssdlite_batch"] = {
                    name: round(ms / batch_ms, 3) for name, ms in extras["framework_ms_per_batch"].items()
                }
            save()
        if "writes" not in skip:
            extras["detections_per_s"] = {
                "postgresql": round(writes.postgres_detections_per_s()),
                "sqlite": round(writes.sqlite_detections_per_s()),
            }
            save()
        if args.enqueue_files:
            extras["enqueue"] = enqueue_bench(work, args.enqueue_files)
        if "scale" not in skip:
            sizes = [int(size) for size in args.scale_sizes.split(",") if size]
            extras["scale"] = scale.scale_table(work / "scale", sizes, list(scale.DEPLOYMENTS), window_s=20.0)
            extras["export_at_300_boxes"] = scale.export_peak(work / "scale")
            extras["one_folder"] = scale.one_folder_enqueue(
                work / "scale", work / "scale" / "sample.jpg", max(sizes)
            )
            extras["largest_image"] = scale.large_image_peak(work / "scale")
            save()
        summary = save()
    print(tables.table(summary["images_per_s"]))
    print(tables.start_up_table(summary))
    print(tables.mixed_table(summary))
    if "scale" in summary:
        print(scale.markdown(summary["scale"]))
    shown = ("images_per_s", tables.START_UPS, tables.AFTER_CLAIM, tables.MIXED)
    print({k: v for k, v in summary.items() if k not in shown})
    return 0


def _rounded(found: dict[str, dict[str, list[float]]], digits: int = 2) -> dict[str, dict[str, list[float]]]:
    return {w: {n: [round(r, digits) for r in rs] for n, rs in named.items()} for w, named in found.items()}


def mixed_bench(model: Path, photos: Path, work: Path, repeat: int) -> dict[str, list[float]]:
    """One normal and one throttled worker on a job, against the normal one alone (bench/mixed.py)."""
    found: dict[str, list[float]] = {}
    for _ in range(repeat):
        for name, rate in mixed.mixed_runs(model, photos, work).items():
            found.setdefault(name, []).append(round(rate, 2))
            print(f"mixed pools {name}: {rate:.1f} images/s", flush=True)
    return found


OVERHEAD_IMAGES = (400, 2000)  # two job sizes: the difference cancels start-up, leaving the cost per batch


def framework_overhead(work: Path, repeat: int) -> dict[str, Any]:
    """What the framework costs per batch: a model that costs nothing (fixed boxes) on tiny photos.

    Each deployment runs a job of 400 and one of 2,000 photos; the extra time of the larger, divided by its
    extra batches per process, is the cost of one batch in steady state (enqueue start-up cancels out).
    """
    model = save_fixed_box_model(work / "fixed.pt")
    cores = len(os.sched_getaffinity(0))
    batch = 8
    extra = {"DETQ_BATCH_SIZE": str(batch)}
    folders = {count: work / f"tiny-{count}" for count in OVERHEAD_IMAGES}
    for count, folder in folders.items():
        write_photos(folder, count, (64, 48), seed=7)
    run = {"embedded": deployments.detq_embedded, "redis_postgres": deployments.detq_redis_postgres}
    rates: dict[str, dict[int, list[float]]] = {name: {n: [] for n in folders} for name in run}
    for _ in range(repeat):
        for name, deploy in run.items():
            for count, folder in folders.items():
                rates[name][count].append(round(deploy(model, folder, work, cores, extra).rate, 1))
    small, large = OVERHEAD_IMAGES
    per_batch_ms = {}
    for name, by_count in rates.items():
        seconds = {n: n / max(r) for n, r in by_count.items()}  # best runs
        extra_batches_per_process = (large - small) / batch / cores
        per_batch_ms[name] = round(1000 * (seconds[large] - seconds[small]) / extra_batches_per_process, 1)
    return {
        "trivial_model_images_per_s": {name: {str(n): r for n, r in c.items()} for name, c in rates.items()},
        "framework_ms_per_batch": per_batch_ms,
    }


def enqueue_bench(work: Path, files: int) -> dict[str, Any]:
    """Files/s and peak memory of `detq enqueue` at a tenth of the folder and the whole, both deployments."""
    sample = write_photos(work / "sample", 1, (64, 48))[0]
    model = save_fixed_box_model(work / "enqueue-model.pt")
    found: dict[str, Any] = {}
    for count in (files // 10, files):
        folder = enqueue.write_folder(work / f"files-{count}", count, sample)
        embedded = enqueue.enqueue_embedded(model, folder, work)
        redis_pg = enqueue.enqueue_redis_postgres(model, folder, work)
        found[str(count)] = {
            "embedded": {"files_per_s": round(embedded[0]), "peak_mib": round(embedded[1])},
            "redis_postgres": {"files_per_s": round(redis_pg[0]), "peak_mib": round(redis_pg[1])},
        }
    return found


if __name__ == "__main__":
    sys.exit(main())
