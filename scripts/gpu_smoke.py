"""GPU pool end to end on a CUDA machine: a model saved on cuda, loaded once per GPU process, detections
written, with images/s and how busy the GPUs were. Not part of `make test` (CI has no GPU); run it where a
GPU is lent:

    .venv/bin/python scripts/gpu_smoke.py [--model demo|ssdlite] [--images 256] [--batch-size 64]
                                          [--micro-batch 32] [--precision bf16] [--out DIR]
                                          [--rehearse-on-cpu]

demo: the bundled demo model on small shape images; passes when every image is done on a cuda device with
the same detections (within 1%) as the CPU pool gives for the CPU-saved file (at fp32; at fp16 or bf16 the
count is reported, not compared). ssdlite: a scripted
torchvision SSDlite320 (random weights, up to 300 boxes an image) on 1280x960 photos, the throughput
workload of docs/benchmarks.md; passes when every image is done on a cuda device. Both print a JSON report
(images_per_s, gpu_busy_percent from nvidia-smi, sampled every 200 ms during the job; each also from the
job's first claimed image on, after the enqueue command's start-up: start_up_s) and exit 0, or 1 with the
reason.

--rehearse-on-cpu runs every step on the CPU pool instead (the CPU-saved model, no GPU figures): the
suite runs it (tests/scripts/test_gpu_smoke.py), so that a lent GPU's few minutes go to the GPU, not
to the script.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.deployments import JobRun, job_run  # noqa: E402
from bench.photos import write_photos  # noqa: E402
from demo.shapes import write_dataset  # noqa: E402
from detq.settings import BUNDLED_MODEL  # noqa: E402
from tests.integration.harness import LOADED_MARK, Deployment, running_worker  # noqa: E402
from tests.support import save_torchvision_detector  # noqa: E402

SAMPLE_MS = 200


def save_on_cuda(src: Path, dst: Path) -> None:
    """Load a TorchScript model onto cuda:0 and save it there, as a user's GPU training box would."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        extra = {"detq.json": ""}
        module = torch.jit.load(str(src), map_location="cuda:0", _extra_files=extra)
        torch.jit.save(module, str(dst), _extra_files=extra)


def parse_busy(text: str) -> list[tuple[float, int]]:
    """nvidia-smi's `timestamp, utilization.gpu` lines as (seconds since the epoch, percent); the
    timestamp is the machine's local time, as time.time() counts it."""
    found = []
    for line in text.splitlines():
        stamp, _, percent = line.rpartition(",")
        if not (stamp.strip() and percent.strip().isdigit()):
            continue  # a blank line, or [N/A] where a GPU reports no utilisation
        try:
            when = datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except ValueError:
            continue  # a timestamp in another format: that sample is left out, not the whole report
        found.append((when, int(percent)))
    return found


class BusySampler:
    """nvidia-smi's utilization.gpu of every GPU, sampled while the block runs; mean_percent() after."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self.samples: list[tuple[float, int]] = []  # (when, percent), a line per GPU per sample

    def __enter__(self) -> BusySampler:
        try:
            self._proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=timestamp,utilization.gpu",
                    "--format=csv,noheader,nounits",
                    f"-lms={SAMPLE_MS}",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except FileNotFoundError:
            self._proc = None  # no nvidia-smi: the report says null
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=10)
        self.samples = parse_busy(out)

    def mean_percent(self, since: float | None = None) -> float | None:
        """The mean utilisation over the samples of every GPU (from `since`, epoch seconds, where given),
        or None when nothing was sampled."""
        kept = [percent for when, percent in self.samples if since is None or when >= since]
        return round(sum(kept) / len(kept), 1) if kept else None


def run_gpu_job(
    deployment: Deployment, images: Path, processes: int, pool: str = "gpu"
) -> tuple[dict[str, Any], JobRun, float, str, BusySampler]:
    """The job on the pool (the GPU pool, unless rehearsing): its status, its times (from `detq enqueue`
    to its first claimed image and to its last finished one), when that first claim was (epoch seconds),
    the worker's log, the sampler."""
    with running_worker(deployment, pool=pool, concurrency=processes, name=pool) as worker:
        with BusySampler() as busy:
            began = time.time()
            status = deployment.run_json("enqueue", str(images), "--pool", pool, "--wait", "--timeout", "600")
        run = job_run(deployment, status, began)
        return status, run, began + run.start_up_s, worker.log(), busy


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=["demo", "ssdlite"], default="demo")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=None, help="DETQ_BATCH_SIZE (default: detq's)")
    parser.add_argument("--micro-batch", type=int, default=None, help="DETQ_MICRO_BATCH (default: detq's)")
    parser.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default=None, help="DETQ_PRECISION")
    parser.add_argument("--out", type=Path, default=None, help="folder for the GPU worker's log")
    parser.add_argument(
        "--rehearse-on-cpu", action="store_true", help="every step on the CPU pool, to check the script"
    )
    args = parser.parse_args()
    rehearse = args.rehearse_on_cpu
    if not rehearse and not torch.cuda.is_available():
        print(json.dumps({"ok": False, "reason": "torch.cuda.is_available() is False"}))
        return 1
    gpus = 0 if rehearse else torch.cuda.device_count()
    processes, pool, device_prefix = (1, "cpu", "cpu") if rehearse else (gpus, "gpu", "cuda:")
    extra = {
        name: str(value)
        for name, value in (
            ("DETQ_BATCH_SIZE", args.batch_size),
            ("DETQ_MICRO_BATCH", args.micro_batch),
            ("DETQ_PRECISION", args.precision),
        )
        if value is not None
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        images = tmp / "images"
        if args.model == "demo":
            write_dataset(images, args.images, seed=5)
            cpu_saved = BUNDLED_MODEL
        else:
            write_photos(images, args.images, (1280, 960))
            cpu_saved = save_torchvision_detector(tmp / "ssdlite.pt", "ssdlite")
        if rehearse:
            tested_model = cpu_saved
        else:
            tested_model = tmp / f"{args.model}_cuda.pt"
            save_on_cuda(cpu_saved, tested_model)
        gpu = Deployment(data_dir=tmp / "gpu", model=tested_model, extra=extra)
        status, run, claimed, log, busy = run_gpu_job(gpu, images, processes, pool)
        exported = gpu.run("export", str(status["job_id"]), "--format", "jsonl").stdout
        devices = sorted({json.loads(line)["device"] for line in exported.splitlines() if line})
        cpu_detections = None
        if args.model == "demo":
            cpu = Deployment(data_dir=tmp / "cpu", model=cpu_saved)
            with running_worker(cpu, pool="cpu", concurrency=2, name="cpu"):
                cpu_status = cpu.run_json(
                    "enqueue", str(images), "--pool", "cpu", "--wait", "--timeout", "600"
                )
            cpu_detections = cpu_status["detections"]
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_worker.log").write_text(log)
    report: dict[str, Any] = {
        "model": args.model,
        "gpus": gpus,
        "gpu_name": None if rehearse else torch.cuda.get_device_name(0),
        "rehearsal_on_cpu": rehearse,
        "settings": extra,
        "images": status["total"],
        "done": status["done"],
        "devices": devices,
        "model_loads": log.count(LOADED_MARK),
        "pool": pool,
        "images_per_s": round(run.rate, 1),
        # The enqueue command's start-up, then the pace and the GPUs' use once the first batch is claimed
        "start_up_s": round(run.start_up_s, 2),
        "images_per_s_after_first_claim": round(run.rate_after_first_claim, 1),
        "gpu_busy_percent": busy.mean_percent(),
        "gpu_busy_percent_after_first_claim": busy.mean_percent(since=claimed),
        "busy_samples": len(busy.samples),
        "detections": status["detections"],
        "detections_cpu_reference": cpu_detections,
    }
    ok = (
        status["done"] == status["total"] == args.images
        and bool(devices)
        and all(d.startswith(device_prefix) for d in devices)
        and report["model_loads"] == processes
        and (
            cpu_detections is None
            or args.precision not in (None, "fp32")
            or abs(status["detections"] - cpu_detections) <= max(2, status["detections"] // 100)
        )
    )
    report["ok"] = ok
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
