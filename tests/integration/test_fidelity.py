"""A stored result is what the user's model gives on that image alone, whatever shares its batch: detectors
that pad a batch to its largest image (Faster R-CNN, RetinaNet, FCOS), through real workers on both
deployments, against the plain loop a user writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from PIL import Image, ImageOps

from bench.photos import write_photo
from tests.integration.harness import Deployment, running_worker
from tests.support import save_torchvision_detector
from worker.models.agreement import agreement
from worker.models.loading import load_model_for_device
from worker.models.outputs import RawDetections, parse_torchvision_output
from worker.models.tensors import to_tensor

pytestmark = pytest.mark.integration

FAMILIES = ("fasterrcnn_r18", "retinanet", "fcos")
SIZES = [(640, 480), (1280, 960), (480, 640), (800, 600), (1024, 768), (640, 427)]


def _photos(folder: Path, count: int) -> list[Path]:
    """Photos of six sizes, every fifth turned by EXIF: the mixed folder a user has."""
    folder.mkdir()
    return [
        write_photo(
            folder / f"p{i:02d}.jpg", *SIZES[i % len(SIZES)], seed=i, orientation=6 if i % 5 == 4 else 1
        )
        for i in range(count)
    ]


def _plain_loop(module: Any, photo: Path) -> RawDetections:
    """Pillow, EXIF orientation, RGB, to_tensor, model([img]): one image a forward."""
    with Image.open(photo) as opened:
        image = ImageOps.exif_transpose(opened).convert("RGB")
    with torch.inference_mode():
        (found,) = parse_torchvision_output(module([to_tensor(image)]), expected=1)
    return found


def _stored(deployment: Deployment, job_id: int) -> dict[str, RawDetections]:
    """Each image's detections as the ledger holds them, unrounded, by file name."""
    url = deployment.database_url or f"sqlite:///{deployment.data_dir / 'detq.db'}"
    engine = sa.create_engine(url)
    rows: dict[str, list[tuple[int, float, float, float, float, float]]] = {}
    with engine.connect() as conn:
        for path, status in conn.execute(
            sa.text("select path, status from images where job_id = :job"), {"job": job_id}
        ):
            assert status == "done", (path, status)
            rows[Path(path).name] = []
        for path, label, score, x1, y1, x2, y2 in conn.execute(
            sa.text(
                "select i.path, d.label_id, d.score, d.x1, d.y1, d.x2, d.y2 from detections d "
                "join images i on i.id = d.image_id where i.job_id = :job order by i.path, d.rank"
            ),
            {"job": job_id},
        ):
            rows[Path(path).name].append((label, score, x1, y1, x2, y2))
    engine.dispose()
    return {
        name: RawDetections(
            boxes=torch.tensor([r[2:] for r in found], dtype=torch.float64).reshape(-1, 4),
            labels=torch.tensor([r[0] for r in found], dtype=torch.int64),
            scores=torch.tensor([r[1] for r in found], dtype=torch.float64),
        )
        for name, found in rows.items()
    }


def test_mixed_size_photos_are_stored_as_the_plain_loop_finds_them(
    deployment: Deployment, tmp_path: Path
) -> None:
    # Given three detector families that keep the aspect ratio and pad a batch to its largest image,
    # and a folder of photos of six sizes
    photos = _photos(tmp_path / "photos", 12)
    models = {name: save_torchvision_detector(tmp_path / f"{name}.pt", name) for name in FAMILIES}
    deployment.model = models[FAMILIES[0]]
    # When each runs over the folder through a real worker of two pool processes, at the defaults
    # (forwards of up to eight images, 2.5 MP on a CPU)
    jobs = {}
    with running_worker(deployment, concurrency=2):
        for name, model in models.items():
            status = deployment.run_json(
                "enqueue",
                str(tmp_path / "photos"),
                "--model",
                str(model),
                "--wait",
                "--timeout",
                "400",
                timeout=450,
            )
            assert status["done"] == status["total"] == len(photos), status
            jobs[name] = status["job_id"]
    # Then every stored box is the plain loop's: recall and precision 1.0 at IoU 0.99, scores within 1e-3
    for name, model_path in models.items():
        module = load_model_for_device(model_path, "cpu").module
        stored = _stored(deployment, jobs[name])
        matched = expected = found = 0
        for photo in photos:
            agreed = agreement(_plain_loop(module, photo), stored[photo.name])
            matched, expected, found = (
                matched + agreed.matched,
                expected + agreed.expected,
                found + agreed.found,
            )
            assert agreed.agrees, (name, photo.name, agreed)
        assert expected > 0 and matched == expected == found, name
