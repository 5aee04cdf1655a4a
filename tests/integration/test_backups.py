"""Mixed hardware: at a queue's tail an idle worker races a throttled one on its batch, so the job ends
without waiting for the slow worker; nothing is written twice."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.integration.faults import (
    FAST_HEALING,
    check_ledger,
    digests,
    pool_pids,
    save_slow_model,
    wait_until,
    write_images,
)
from tests.integration.harness import Deployment, running_worker
from tests.integration.throttle import Throttle

pytestmark = pytest.mark.integration

# 24 images of about 0.1 s in batches of 4: the fast worker alone needs about 2.4 s of model time; the
# slow one, at 3% of a core, about 13 s for its one batch.
IMAGES = 24
SLOW_MS = 100
SLOW_BATCH = re.compile(r"batch of \d+:")


def test_an_idle_worker_races_a_throttled_one_and_the_job_ends_before_the_slow_batch(
    deployment: Deployment, tmp_path: Path
) -> None:
    # Given a slow worker (its pool process throttled to 3% of a core) and a fast one, on one queue
    deployment.extra.update(FAST_HEALING)
    deployment.model = save_slow_model(tmp_path / "slow.pt", SLOW_MS)
    images = write_images(tmp_path / "in", IMAGES)
    before = digests(images)
    with running_worker(deployment, concurrency=1, name="slow") as slow:
        with Throttle(pool_pids(slow), share=0.03), running_worker(deployment, concurrency=1, name="fast"):
            # When a job is enqueued and the slow worker takes one of its batches
            job_id = deployment.run_json("enqueue", str(tmp_path / "in"), "--batch-size", "4")["job_id"]
            started = time.monotonic()
            wait_until(
                lambda: deployment.job_status(job_id)["state"] == "finished",
                120,
                "job finished",
                interval=0.3,
            )
            finished = time.monotonic()
            # Then the job finished while the slow worker was still on its batch
            # (Its batch may hold fewer than 4 images: the job's last batches taper for the two processes.)
            assert not SLOW_BATCH.search(slow.log()), "the slow worker finished a batch: nothing was raced"
        # And when it ends, its batch found its images finished by the backup
        wait_until(lambda: SLOW_BATCH.search(slow.log()) is not None, 120, "the slow batch ended")
    print(f"\nmixed pools: job finished {finished - started:.1f} s after enqueue")
    (taken,) = [int(n) for n in re.findall(r"batch of \d+: .* (\d+) already finished or taken", slow.log())]
    assert taken >= 1, "the backup finished none of the slow batch's images first"
    check = check_ledger(deployment, job_id, images, before)
    assert set(check.statuses.values()) == {"done"}
    assert set(check.attempts.values()) == {1}  # a backup takes no claim and counts no attempt
