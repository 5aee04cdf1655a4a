"""A worker's Prometheus endpoint: images by status and reason, times, model loads, queue depth."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from tests.integration.harness import Deployment, running_worker
from tests.integration.servers import free_port
from tests.support import save_fixed_box_model, write_corrupt_folder

pytestmark = pytest.mark.integration


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_a_worker_serves_metrics_of_its_pool_processes(deployment: Deployment, tmp_path: Path) -> None:
    # Given a worker of two processes serving metrics, and a folder of good and bad files
    port = free_port()
    deployment.extra["DETQ_METRICS_PORT"] = str(port)
    deployment.model = save_fixed_box_model(tmp_path / "box.pt", input_size=[64, 64])
    expected = write_corrupt_folder(tmp_path / "in", tmp_path / "outside")
    with running_worker(deployment, concurrency=2):
        deployment.run(
            "enqueue", str(tmp_path / "in"), "--batch-size", "4", "--wait", "--timeout", "120", codes=(4,)
        )
        samples = _scrape(port)
    # Then the counts by status add up to the folder, with reasons, from both processes
    counted = {
        status: sum(
            v for k, v in samples.items() if k.startswith("detq_images_total{") and f'status="{status}"' in k
        )
        for status in ("done", "failed", "rejected")
    }
    assert counted == {s: float(list(expected.values()).count(s)) for s in counted}
    assert any('reason="empty file"' in k for k in samples)
    assert samples["detq_model_load_seconds_count"] == 2.0  # once per pool process
    assert samples["detq_batch_seconds_count"] >= 2.0
    assert samples["detq_inference_seconds_count"] == 3.0  # the three good images
    assert samples['detq_queue_depth{queue="any"}'] == 0.0
    assert samples["detq_dead_letters"] == 0.0  # nothing set aside
