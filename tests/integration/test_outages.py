"""Outages of the services around the workers: Redis restarted, PostgreSQL down for 30 s, the broker
lost in the middle of an enqueue. Throwaway servers on their own ports; the shared ones are never stopped."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from db.ledger import open_ledger
from detq.celery_app import make_celery_app
from detq.settings import Settings
from detq.vocabulary import JobPool
from dispatch.broker import read_broker
from dispatch.reconcile import reconcile
from producer.enqueue import EnqueueError, enqueue_folders
from producer.status import job_status
from tests.integration.faults import (
    FAST_HEALING,
    check_ledger,
    digests,
    save_slow_model,
    wait_until,
    write_images,
)
from tests.integration.harness import Deployment, running_worker
from tests.integration.servers import ThrowawayPostgres, ThrowawayRedis

pytestmark = pytest.mark.integration


@pytest.fixture()
def throwaway_redis() -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis()
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def throwaway_postgres() -> Iterator[ThrowawayPostgres]:
    server = ThrowawayPostgres()
    server.start()
    yield server
    server.remove()


def _progress(deployment: Deployment, job_id: int) -> dict[str, int] | None:
    """The job's counts, or None while the ledger cannot be read (during an outage)."""
    try:
        status = deployment.job_status(job_id)
    except Exception:  # noqa: BLE001 - the database or its disk is away: no reading yet
        return None
    return {key: int(status[key]) for key in ("done", "failed", "rejected", "pending")} | {
        "finished": int(status["state"] == "finished")
    }


def _reached(deployment: Deployment, job_id: int, done: int) -> bool:
    progress = _progress(deployment, job_id)
    return progress is not None and progress["done"] >= done


def _finished(deployment: Deployment, job_id: int) -> bool:
    progress = _progress(deployment, job_id)
    return progress is not None and progress["finished"] == 1


def _survives(deployment: Deployment, tmp_path: Path, outage: Callable[[], None], what: str) -> None:
    """Run 48 images of about 0.1 s on two processes; cause the outage once 8 are done; the job must
    finish by itself, every image done once, inputs unchanged."""
    deployment.run("db", "upgrade")
    deployment.extra.update(FAST_HEALING)
    deployment.model = save_slow_model(tmp_path / "slow.pt", 100)
    images = write_images(tmp_path / "in", 48)
    before = digests(images)
    with running_worker(deployment, concurrency=2):
        job_id = deployment.run_json("enqueue", str(tmp_path / "in"), "--batch-size", "8")["job_id"]
        wait_until(lambda: _reached(deployment, job_id, 8), 120, "8 images done")
        outage()
        back_at = time.monotonic()
        finished_at = wait_until(lambda: _finished(deployment, job_id), 240, "job finished", interval=0.5)
    print(f"\n{what}: job finished {finished_at - back_at:.1f} s after the service came back")
    check = check_ledger(deployment, job_id, images, before)
    assert set(check.statuses.values()) == {"done"}, "an image was failed or lost for the outage"
    # And no attempt was counted for it: attempts count the processes that died on an image, and none did
    assert set(check.attempts.values()) == {1}, check.attempts


def test_redis_restarted_mid_run_the_job_completes(
    throwaway_redis: ThrowawayRedis, postgres_url: str, tmp_path: Path
) -> None:
    # Given a job running against a Redis that keeps nothing across a restart
    deployment = Deployment(tmp_path / "data", database_url=postgres_url, broker_url=throwaway_redis.url)

    def restart_empty() -> None:  # every queued message is gone
        throwaway_redis.stop()
        time.sleep(2)
        throwaway_redis.start()

    # Then the workers reconnect, the lost batches are sent again, and the job completes
    _survives(deployment, tmp_path, restart_empty, "redis restart")


def test_postgres_down_for_30_s_mid_run_loses_and_fails_nothing(
    throwaway_postgres: ThrowawayPostgres, redis_url: str, tmp_path: Path
) -> None:
    # Given a job running against a PostgreSQL of its own
    deployment = Deployment(tmp_path / "data", database_url=throwaway_postgres.url, broker_url=redis_url)

    def stop_for_30_s() -> None:
        throwaway_postgres.stop()
        time.sleep(30)
        throwaway_postgres.start()

    # Then batches in flight waited and retried, and the job completes with nothing failed for it
    _survives(deployment, tmp_path, stop_for_30_s, "postgres outage")


def test_the_broker_lost_mid_enqueue_closes_the_job_and_its_images_run_once_it_is_back(
    throwaway_redis: ThrowawayRedis, tmp_path: Path
) -> None:
    # Given an enqueue of 4100 files (three chunks) whose broker dies once the first chunk is queued
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(4100):
        (folder / f"{i:05d}.jpg").write_bytes(b"")
    settings = Settings(_env_file=None, data_dir=tmp_path / "data", broker_url=throwaway_redis.url)
    model = Path(__file__).resolve().parents[2] / "worker" / "assets" / "demo_detector.pt"
    app = make_celery_app(settings)

    def on_progress(images: int, batches: int) -> None:
        throwaway_redis.stop()

    with open_ledger(settings) as led:
        # When the enqueue goes on
        with pytest.raises(EnqueueError) as raised:
            enqueue_folders(
                led.sessions,
                app,
                roots=[folder],
                model_path=model,
                pool=JobPool.ANY,
                batch_size=64,
                on_progress=on_progress,
            )
        with led.sessions() as session:
            status = job_status(session, 1)
        # Then it stopped with one clear message, and the job is closed with the images it recorded, none
        # of them failed for the broker's absence: they are pending
        message = str(raised.value)
        assert message.startswith("job 1 closed with the ") and "which run once the broker is back" in message
        assert "--only-new for the rest" in message and "\n" not in message
        assert status.state == "running" or status.state == "queued"
        assert status.failed == 0 and status.pending == status.total > 0
        assert status.closed_reason is not None and "broker became unreachable" in status.closed_reason
        # And once the broker is back, a reconciler pass sends every batch of them
        throwaway_redis.start()
        report = reconcile(led, app, settings, job_id=1, grace_s=0)
        queued = read_broker(app, settings).queued
    app.close()
    assert report.resent_images == status.total
    assert len(queued) == report.resent_batches > 0
