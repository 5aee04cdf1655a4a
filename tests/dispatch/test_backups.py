"""Tests for choosing backup copies at a queue's tail."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from db.batches_repo import OpenBatch
from detq.contract import backup_task_id_for, queue_for_pool, task_id_for
from dispatch.backups import NodeLoad, backups_to_send, queues_open_to_backups

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(seconds=60)
CPU_QUEUES = ("cpu", "any")


def _batch(batch_id: int, sent_at: datetime = OLD, pool: str = "any", sends: int = 1) -> OpenBatch:
    return OpenBatch(batch_id, 1, pool, 16, 16, None, sent_at, sends)


def _node(name: str, processes: int, *held: int) -> NodeLoad:
    return NodeLoad(name, CPU_QUEUES, processes, frozenset(task_id_for(b) for b in held))


def _chosen(
    batches: list[OpenBatch], nodes: list[NodeLoad], queued: frozenset[str] = frozenset()
) -> list[int | None]:
    return [b.batch_id for b in backups_to_send(batches, nodes, set(queued), NOW, min_age_s=2)]


def test_a_batch_on_a_busy_slow_node_gets_a_backup_when_another_node_idles() -> None:
    batches = [_batch(7), _batch(8)]
    assert _chosen(batches, [_node("slow", 1, 7), _node("fast", 2, 8)]) == [7]


def test_no_backup_while_a_batch_of_the_queue_is_still_waiting() -> None:
    batches = [_batch(7), _batch(9)]
    assert _chosen(batches, [_node("slow", 1, 7), _node("fast", 2)], frozenset({task_id_for(9)})) == []


def test_no_backup_when_only_the_holder_has_an_idle_process() -> None:
    # It could take its own backup: that would only run the batch twice on one node.
    assert _chosen([_batch(7)], [_node("slow", 2, 7), _node("fast", 1, 8)]) == []


def test_no_second_backup_while_one_is_queued_held_or_just_sent() -> None:
    nodes = [_node("slow", 1, 7), _node("fast", 2)]
    assert _chosen([_batch(7)], nodes, frozenset({backup_task_id_for(7)})) == []
    held = [_node("slow", 1, 7), NodeLoad("fast", CPU_QUEUES, 2, frozenset({backup_task_id_for(7)}))]
    assert _chosen([_batch(7)], held) == []
    just_backed_up = _batch(7, sent_at=NOW - timedelta(seconds=1), sends=2)
    assert _chosen([just_backed_up], nodes) == []
    assert _chosen([_batch(7, sent_at=NOW - timedelta(seconds=3), sends=2)], nodes) == [7]


def test_a_batch_sent_once_gets_its_backup_however_recently_it_was_sent() -> None:
    # A short job's tail: the slow node took a batch sent a second ago; the fast one idles now.
    nodes = [_node("slow", 1, 7), _node("fast", 2)]
    assert _chosen([_batch(7, sent_at=NOW - timedelta(seconds=1))], nodes) == [7]


def test_backups_never_outnumber_the_idle_processes_of_their_queue() -> None:
    batches = [_batch(1), _batch(2), _batch(3)]
    nodes = [_node("slow", 3, 1, 2, 3), _node("fast", 2)]
    assert _chosen(batches, nodes) == [1, 2]


def test_a_node_that_does_not_consume_the_queue_is_not_idle_capacity_for_it() -> None:
    gpu = NodeLoad("gpu", ("gpu", "any"), 2, frozenset())
    assert _chosen([_batch(7, pool="cpu")], [_node("slow", 1, 7), gpu]) == []
    assert _chosen([_batch(7, pool="any")], [_node("slow", 1, 7), gpu]) == [7]


def test_a_batch_no_node_holds_is_left_to_the_resend() -> None:
    assert _chosen([_batch(7)], [_node("fast", 2)]) == []


def test_backups_go_only_to_queues_open_to_them() -> None:
    # Given fleets: a busy slow node beside an idle one (on the same queues, or on the GPU queue only),
    # only idle nodes, only busy ones
    gpu_idle = NodeLoad("gpu", ("gpu",), 1, frozenset())
    fleets = [
        [_node("slow", 1, 7), _node("fast", 2, 8)],
        [_node("slow", 1, 7), gpu_idle],
        [_node("a", 2), _node("b", 1)],
        [_node("slow", 1, 7), _node("fast", 1, 8)],
    ]
    batches = [_batch(7), _batch(8), _batch(9, pool="cpu")]
    # Then the tail pass's precondition holds exactly where a backup can be chosen, and every backup
    # chosen is on one of those queues
    assert [sorted(queues_open_to_backups(nodes)) for nodes in fleets] == [["any", "cpu"], [], [], []]
    for nodes in fleets:
        chosen = backups_to_send(batches, nodes, set(), NOW, min_age_s=2)
        assert {queue_for_pool(b.pool) for b in chosen} <= queues_open_to_backups(nodes)
    assert _chosen(batches, fleets[0]) == [7]
