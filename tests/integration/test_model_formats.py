"""Bring your own detector, end to end through a real CPU pool: YOLO layouts, final boxes, a torch.export
program, a graph with a baked cuda:0 constant, and scripted torchvision detectors saved as on a GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from detq.speedups import SPEEDUPS
from tests.integration.harness import Deployment, running_worker
from tests.support import (
    letterbox_expectation,
    retag_archive_device,
    save_exported_boxes,
    save_final_boxes,
    save_torchvision_detector,
    save_traced_with_baked_device,
    save_yolov5_like,
    save_yolov8_like,
    write_png,
)

pytestmark = pytest.mark.integration

SIZES = [(640, 480), (480, 640), (1000, 300)]


def _ledger(deployment: Deployment, job_id: int) -> dict[str, dict[str, Any]]:
    out = deployment.run("export", str(job_id), "--format", "jsonl").stdout
    return {Path(r["path"]).name: r for r in map(json.loads, out.splitlines())}


def _run(
    deployment: Deployment, images: Path, model: Path
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    status = deployment.run_json("enqueue", str(images), "--model", str(model), "--wait", "--timeout", "240")
    assert status["done"] == status["total"] == len(SIZES), status
    return status, _ledger(deployment, status["job_id"])


def test_model_formats_end_to_end(embedded: Deployment, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    images = tmp_path / "images"
    images.mkdir()
    for w, h in SIZES:
        write_png(images / f"img_{w}x{h}.png", (w, h))
    yolov8 = save_yolov8_like(models / "yolo11n.torchscript")
    yolov8_cuda = models / "yolo11n_cuda.torchscript"
    retag_archive_device(yolov8, yolov8_cuda)
    embedded.model = yolov8_cuda
    with running_worker(embedded, concurrency=1):
        # YOLOv8 layout saved as on cuda:0, with only Ultralytics' config.txt: no flags needed
        status, ledger = _run(embedded, images, yolov8_cuda)
        for (w, h), row in zip(SIZES, (ledger[f"img_{w}x{h}.png"] for w, h in SIZES), strict=True):
            (det,) = row["detections"]
            assert (det["label"], det["label_id"]) == ("dog", 1)
            assert det["score"] == pytest.approx(0.9, abs=1e-5)
            assert det["box"] == pytest.approx(letterbox_expectation((270, 270, 370, 330), (w, h)), abs=0.01)

        # YOLOv5 layout: objectness x class score
        _, ledger = _run(embedded, images, save_yolov5_like(models / "yolov5s.torchscript"))
        for w, h in SIZES:
            (det,) = ledger[f"img_{w}x{h}.png"]["detections"]
            assert det["label"] == "dog" and det["score"] == pytest.approx(0.72, abs=1e-5)
            assert det["box"] == pytest.approx(letterbox_expectation((270, 270, 370, 330), (w, h)), abs=0.01)

        # Final boxes, TorchScript and a torch.export program
        _, ledger = _run(embedded, images, save_final_boxes(models / "final.pt"))
        assert all(r["detections"][0]["label"] == "cat" for r in ledger.values())
        _, ledger = _run(embedded, images, save_exported_boxes(models / "final.pt2"))
        for w, h in SIZES:
            (det,) = ledger[f"img_{w}x{h}.png"]["detections"]
            assert det["box"] == pytest.approx([w / 4, h / 4, 3 * w / 4, h / 2], abs=0.01)

        # A traced graph with a baked cuda:0 constant is repaired and runs
        _, ledger = _run(embedded, images, save_traced_with_baked_device(models / "baked.pt"))
        assert all(len(r["detections"]) == 2 for r in ledger.values())

        # Scripted torchvision detectors (weights=None) saved as on a GPU
        for name in ("ssdlite", "fasterrcnn"):
            built = save_torchvision_detector(models / f"{name}.pt", name)
            on_gpu = models / f"{name}_cuda.pt"
            assert retag_archive_device(built, on_gpu) >= 1
            det_status, ledger = _run(embedded, images, on_gpu)
            assert all(r["status"] == "done" and r["device"] == "cpu" for r in ledger.values())

    # The same folder run through several models keeps every model's results, each row naming its model
    engine = sa.create_engine(f"sqlite:///{embedded.data_dir / 'detq.db'}")
    with engine.connect() as conn:
        per_model = dict(
            conn.execute(sa.text("select model_id, count(*) from detections group by model_id"))
            .tuples()
            .all()
        )
        wrong = conn.execute(
            sa.text(
                "select count(*) from detections d join images i on i.id = d.image_id "
                "join jobs j on j.id = i.job_id where d.model_id != j.model_id"
            )
        ).scalar_one()
    engine.dispose()
    assert len(per_model) >= 6
    assert wrong == 0
    assert per_model[1] == 3 * 1  # the first model: one dog per image


def test_model_inspect_command(embedded: Deployment, tmp_path: Path) -> None:
    baked = save_traced_with_baked_device(tmp_path / "baked.pt")
    report = embedded.run_json("model", "inspect", str(baked))
    assert report["baked_device_constants"] == ["cuda:0"]
    assert report["loads_here"] is True and report["format"] == "boxes"
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"format": "yolov8", "classes": ["a", "b"]}))
    embedded.run(
        "model",
        "pack",
        str(save_yolov8_like(tmp_path / "v8.pt")),
        "--meta",
        str(meta),
        "-o",
        str(tmp_path / "p.pt"),
    )
    packed = embedded.run_json("model", "inspect", str(tmp_path / "p.pt"))
    assert packed["classes"] == ["a", "b"] and packed["metadata_source"] == "detq.json in the model file"
    assert "micro-batches (any)" in packed["speedups"]
    assert packed["speedups_off"] == [
        "frozen graph (DETQ_CPU_OPTIMIZE=false)",
        "reduced JPEG decode (DETQ_FAST_DECODE=false)",
    ]
    as_saved = embedded.run_json("model", "inspect", str(tmp_path / "p.pt"), "--as-saved")
    assert as_saved["speedups"] == [] and as_saved["micro_batch"] == 1
    assert len(as_saved["speedups_off"]) == len(SPEEDUPS)
