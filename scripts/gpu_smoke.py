"""GPU pool end to end on a CUDA machine: a model saved on cuda, loaded once per GPU process, detections
written. Not part of `make test` (CI has no GPU); run it where a GPU is lent:

    .venv/bin/python scripts/gpu_smoke.py [--images 256] [--out DIR]

Exits 0 and prints a JSON report when every image is done on a cuda device with the same detections as the
CPU pool gives for the CPU-saved file; exits 1 with the reason otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.shapes import write_dataset  # noqa: E402
from detq.settings import BUNDLED_MODEL  # noqa: E402
from tests.integration.harness import LOADED_MARK, Deployment, running_worker  # noqa: E402


def save_on_cuda(src: Path, dst: Path) -> None:
    """Load the demo model onto cuda:0 and save it there, as a user's GPU training box would."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        extra = {"detq.json": ""}
        module = torch.jit.load(str(src), map_location="cuda:0", _extra_files=extra)
        torch.jit.save(module, str(dst), _extra_files=extra)


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "reason": "torch.cuda.is_available() is False"}))
        return 1
    gpus = torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        images = tmp / "images"
        write_dataset(images, args.images, seed=5)
        cuda_model = tmp / "demo_cuda.pt"
        save_on_cuda(BUNDLED_MODEL, cuda_model)
        gpu = Deployment(data_dir=tmp / "gpu", model=cuda_model)
        with running_worker(gpu, pool="gpu", concurrency=gpus, name="gpu") as worker:
            began = time.perf_counter()
            status = gpu.run_json("enqueue", str(images), "--pool", "gpu", "--wait", "--timeout", "300")
            gpu_seconds = time.perf_counter() - began
            log = worker.log()
        ledger = [
            json.loads(x)
            for x in gpu.run("export", str(status["job_id"]), "--format", "jsonl").stdout.split("\n")
            if x
        ]
        cpu = Deployment(data_dir=tmp / "cpu", model=BUNDLED_MODEL)
        with running_worker(cpu, pool="cpu", concurrency=2, name="cpu"):
            cpu_status = cpu.run_json("enqueue", str(images), "--pool", "cpu", "--wait", "--timeout", "600")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_worker.log").write_text(log)
    devices = sorted({row["device"] for row in ledger})
    report = {
        "gpus": gpus,
        "gpu_name": torch.cuda.get_device_name(0),
        "images": status["total"],
        "done_gpu": status["done"],
        "devices": devices,
        "model_loads": log.count(LOADED_MARK),
        "gpu_images_per_s": round(status["total"] / gpu_seconds, 1),
        "detections_gpu": status["detections"],
        "detections_cpu": cpu_status["detections"],
    }
    ok = (
        status["done"] == status["total"] == args.images
        and all(d.startswith("cuda:") for d in devices)
        and report["model_loads"] == gpus
        and abs(status["detections"] - cpu_status["detections"]) <= max(2, status["detections"] // 100)
    )
    report["ok"] = ok
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
