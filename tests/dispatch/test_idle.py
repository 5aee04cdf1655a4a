"""Tests for a node's watch of its pool falling idle."""

from __future__ import annotations

from dispatch.idle import IdleWatch


class _Node:
    """Free processes and a clock the test sets."""

    def __init__(self) -> None:
        self.free = 0
        self.now = 0.0

    def watch(self) -> IdleWatch:
        return IdleWatch(lambda: self.free, lambda: None, settle_s=0.1, clock=lambda: self.now)

    def at(self, now: float, free: int) -> None:
        self.now, self.free = now, free


def test_it_fires_once_when_a_busy_node_has_had_a_process_free_for_the_settle_time() -> None:
    node = _Node()
    watch = node.watch()
    node.at(0.0, 0)
    assert not watch.fell_idle()  # every process busy
    node.at(1.0, 1)
    assert not watch.fell_idle()  # free just now
    node.at(1.05, 1)
    assert not watch.fell_idle()
    node.at(1.1, 1)
    assert watch.fell_idle()  # free for 0.1 s
    node.at(2.0, 1)
    assert not watch.fell_idle()  # once per fall
    node.at(3.0, 0)
    assert not watch.fell_idle()
    node.at(3.2, 2)
    assert not watch.fell_idle()
    node.at(3.35, 2)
    assert watch.fell_idle()  # busy again, then idle again: fires again


def test_a_process_free_between_two_batches_does_not_fire() -> None:
    node = _Node()
    watch = node.watch()
    for step in range(20):  # free for 0.05 s every 0.5 s: the next batch arrives in time
        node.at(step * 0.5, 0)
        assert not watch.fell_idle()
        node.at(step * 0.5 + 0.05, 1)
        assert not watch.fell_idle()


def test_a_node_idle_from_the_start_never_fires() -> None:
    node = _Node()
    watch = node.watch()
    for step in range(10):
        node.at(step * 0.5, 2)
        assert not watch.fell_idle()
