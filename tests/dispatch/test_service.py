"""The reconciler loop of a worker node over a real SQLite ledger and the real embedded broker."""

from __future__ import annotations

import time

from celery import Celery

from db.ledger import Ledger
from db.models import utcnow
from db.workers_repo import Beat, beat
from detq.contract import backup_task_id_for
from detq.settings import Settings
from dispatch.broker import read_broker
from dispatch.idle import IdleWatch
from dispatch.leadership import RECONCILER_LEASE, Leadership
from dispatch.service import ReconcilerLoop
from tests.dispatch.conftest import batch_on_slow_node, live_node


def test_a_node_that_falls_idle_sends_a_backup_itself_without_the_lease(
    ledger: Ledger, app: Celery, settings: Settings
) -> None:
    # Given another process holding the reconciler's lease, and a batch sent a moment ago that a busy
    # slow node took, beside this node's one process, busy for now
    assert Leadership(ledger.sessions, ttl_s=600, owner="elsewhere", name=RECONCILER_LEASE).check()
    batch_id = batch_on_slow_node(ledger, utcnow())
    fast = live_node(ledger, "fast", 1, ["a-task-of-its-own"])
    free = [0]
    looks: list[float] = []  # when the loop read the process's state

    def free_processes() -> int:
        looks.append(time.monotonic())
        return free[0]

    announced: list[float] = []

    def announce() -> None:  # as the node's heartbeat does: its held list, now empty, in the ledger
        announced.append(time.monotonic())
        with ledger.sessions() as s, s.begin():
            beat(s, fast, utcnow(), Beat(held=[]))

    loop = ReconcilerLoop(settings, IdleWatch(free_processes, announce))
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while len(looks) < 2 and time.monotonic() < deadline:  # the loop has seen the process busy
            time.sleep(0.02)
        assert read_broker(app, settings).queued == set()
        # When the process comes free
        free[0] = 1
        deadline = time.monotonic() + 10
        while not read_broker(app, settings).queued and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        loop.stop()
    # Then the node said it was idle and queued the slow batch's backup, once, lease or not
    assert len(announced) == 1
    assert read_broker(app, settings).queued == {backup_task_id_for(batch_id)}
