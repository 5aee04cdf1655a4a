"""Prometheus metrics of a worker: images by outcome, batch, decode and inference times, time limits, model
loads, queues.

Pool processes write their numbers to files in a folder the node made (prometheus_client's multiprocess
mode); the node serves them, with the depth of each queue read from the broker at scrape time.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from celery import Celery

from db.images_repo import ImageResult
from detq.settings import Settings
from dispatch.broker import dead_letters, queue_depths

log = logging.getLogger(__name__)

MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client reads it when first imported
_REASON_KIND = re.compile(r"^[^:(\d/]{1,48}")
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def reason_kind(reason: str | None) -> str:
    """A reason without its particulars (paths, sizes), so label values stay few."""
    if not reason:
        return ""
    match = _REASON_KIND.match(reason)
    return (match.group(0) if match else reason[:48]).strip()


class ProcessMetrics:
    """What one pool process counts; created after fork, written to the node's metrics folder."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self.images = Counter(
            "detq_images_total", "Images brought to a terminal state", ["status", "reason"], registry=None
        )
        self.batch = Histogram("detq_batch_seconds", "Seconds per batch", buckets=SECONDS, registry=None)
        self.decode = Histogram(
            "detq_decode_seconds", "Seconds to decode an image", buckets=SECONDS, registry=None
        )
        self.infer = Histogram(
            "detq_inference_seconds", "Seconds of model time per image", buckets=SECONDS, registry=None
        )
        self.time_limits = Counter(
            "detq_time_limits_total",
            "Batches stopped at the soft time limit, by what became of the rest: sent_again or failed",
            ["outcome"],
            registry=None,
        )
        self.model_load = Histogram(
            "detq_model_load_seconds", "Seconds to load and warm up a model", buckets=SECONDS, registry=None
        )

    def record(self, results: Sequence[ImageResult], batch_seconds: float) -> None:
        """Count a batch's results and times."""
        self.batch.observe(batch_seconds)
        for result in results:
            self.images.labels(status=str(result.status), reason=reason_kind(result.reason)).inc()
            if result.decode_ms is not None:
                self.decode.observe(result.decode_ms / 1000)
            if result.infer_ms is not None:
                self.infer.observe(result.infer_ms / 1000)


class QueueDepths:
    """A collector reading from the broker when scraped: each inference queue's depth, and how many
    messages its consumers set aside (detq/transports.py)."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    def collect(self) -> Iterator[Any]:
        """The detq_queue_depth and detq_dead_letters gauges."""
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("detq_queue_depth", "Batch messages waiting in a queue", labels=["queue"])
        dead = GaugeMetricFamily("detq_dead_letters", "Messages set aside: no worker could use them (kept)")
        try:
            for queue, depth in queue_depths(self.app, self.settings).items():
                family.add_metric([queue], depth)
            dead.add_metric([], dead_letters(self.app, self.settings, latest=0).count)
        except Exception:  # noqa: BLE001 - a scrape during a broker outage shows no depth, not an error page
            log.warning("detq metrics: cannot read the queue depths", exc_info=True)
        yield family
        yield dead


class MetricsServer:
    """The node's endpoint: made before the pool forks, so every process writes where it reads."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        if "prometheus_client" in sys.modules and MULTIPROC_VARIABLE not in os.environ:
            log.warning("detq metrics: prometheus_client was imported early; pool processes may not report")
        self.folder = tempfile.mkdtemp(prefix="detq-metrics-")
        os.environ[MULTIPROC_VARIABLE] = self.folder  # inherited by the pool processes forked after this
        from prometheus_client import CollectorRegistry, multiprocess, start_http_server

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.folder)  # type: ignore[no-untyped-call]
        registry.register(QueueDepths(app, settings))
        assert settings.metrics_port is not None
        self.server, self.thread = start_http_server(
            settings.metrics_port, addr=settings.metrics_address, registry=registry
        )
        log.info("detq metrics on http://%s:%d/metrics", settings.metrics_address, settings.metrics_port)

    def close(self) -> None:
        """Stop serving and remove the processes' files."""
        self.server.shutdown()
        shutil.rmtree(self.folder, ignore_errors=True)
