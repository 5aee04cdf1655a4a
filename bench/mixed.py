"""Mixed hardware: one job served by a normal worker and a throttled one, against the normal one alone.

The throttled worker stands for a much slower machine: its pool process runs 5 ms of every 100 ms
(a CPU quota of a cgroup of its own where one can be set, else SIGSTOP/SIGCONT as cpulimit does; see
tests/integration/throttle.py), about 20 times slower. Without backups the job waits for the
batch it holds at the end.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

from bench.deployments import redis_postgres
from bench.tables import FAST_ALONE
from tests.integration.faults import pool_pids
from tests.integration.harness import running_worker
from tests.integration.throttle import Throttle

SLOW_SHARE = 0.05


def mixed_job(model: Path, photos: Path, base: Path, *, slow: bool, backups: bool = True) -> float:
    """Images/s of one job on one normal pool process, and with slow=True a throttled one beside it."""
    extra = {"DETQ_BATCH_SIZE": "8", "DETQ_TORCH_THREADS": "1", "DETQ_BACKUPS": str(backups).lower()}
    with redis_postgres(base, "mixed", model, extra) as deployment, ExitStack() as stack:
        if slow:
            throttled = stack.enter_context(running_worker(deployment, concurrency=1, name="slow"))
            stack.enter_context(Throttle(pool_pids(throttled), share=SLOW_SHARE))
        stack.enter_context(running_worker(deployment, concurrency=1, name="fast"))
        began = time.time()
        status = deployment.run_json("enqueue", str(photos), "--pool", "cpu", "--wait", "--timeout", "3600")
    assert status["done"] == status["total"], status
    finished = datetime.fromisoformat(status["finished_at"]).timestamp()
    return float(status["total"]) / (finished - began)


def mixed_runs(model: Path, photos: Path, base: Path) -> dict[str, float]:
    """The three configurations, one run each (images/s)."""
    return {
        FAST_ALONE: mixed_job(model, photos, base, slow=False),
        "fast + slow, backups": mixed_job(model, photos, base, slow=True),
        "fast + slow, no backups": mixed_job(model, photos, base, slow=True, backups=False),
    }
