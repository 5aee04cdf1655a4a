"""The embedded broker never shows half a message, an unreadable one does not stop its consumer, a full
node takes its next message as soon as a slot frees, and a busy one polls fast."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import monotonic
from typing import Any

import pytest
from kombu import Connection, Consumer, Producer, Queue
from kombu.message import Message

from detq.celery_app import make_celery_app
from detq.contract import TASK_PROCESS_BATCH
from detq.embedded_broker import Transport
from detq.settings import Settings


def test_a_torn_message_file_is_dropped_and_the_next_one_delivered(tmp_path: Path) -> None:
    # Given the embedded broker's queue holding a message cut short (its producer was killed mid-write)
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    app = make_celery_app(settings)
    queue = settings.broker_dir / "queue"
    (queue / f"{0:020d}_torn.any.msg").write_text('{"body": "abc')  # named as if written first
    # And a whole message behind it
    app.send_task(TASK_PROCESS_BATCH, args=[1, [2]], task_id="detq-batch-9", queue="any", routing_key="any")
    assert not list(queue.glob("*.partial")), "messages are renamed into place once written"
    # When a consumer reads the queue
    with app.connection_for_read() as connection:
        message = connection.default_channel.basic_get("any", no_ack=True)
    app.close()
    # Then the torn file is gone and the whole message came through
    assert message is not None and message.headers["id"] == "detq-batch-9"
    assert list(queue.glob("*.msg")) == []


def test_messages_sent_within_a_millisecond_are_taken_in_the_order_they_were_sent(tmp_path: Path) -> None:
    # Given forty batch messages sent as fast as one producer sends them (a job's tapered last batches)
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    app = make_celery_app(settings)
    for n in range(40):
        app.send_task(
            TASK_PROCESS_BATCH, args=[1, [n]], task_id=f"detq-batch-{n}", queue="any", routing_key="any"
        )
    # When a consumer takes them one by one
    taken = []
    with app.connection_for_read() as connection:
        while (message := connection.default_channel.basic_get("any", no_ack=True)) is not None:
            taken.append(message.headers["id"])
    app.close()
    # Then in the order they were sent
    assert taken == [f"detq-batch-{n}" for n in range(40)]


def test_message_names_and_delivery_tags_are_unique_across_channels_and_forked_copies(
    tmp_path: Path,
) -> None:
    # Given one channel that sends three messages, is copied into a forked process that sends three,
    # and sends three more itself; and a second app's channel that sends three
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    apps = [make_celery_app(settings), make_celery_app(settings)]
    with apps[0].connection_for_write() as connection:
        producer = Producer(connection.default_channel)

        def send(tag: str) -> None:
            for n in range(3):
                producer.publish({"n": n}, routing_key="any", headers={"from": tag}, declare=[Queue("any")])

        send("parent")
        child = os.fork()
        if child == 0:  # pragma: no cover - the forked copy; its messages are checked below
            try:
                send("child")
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        send("parent again")
    with apps[1].connection_for_write() as connection:
        Producer(connection.default_channel).publish(
            {"n": 0}, routing_key="any", headers={"from": "other app"}, declare=[Queue("any")]
        )
    names = [path.name for path in (settings.broker_dir / "queue").glob("*.msg")]
    # When a consumer takes every message
    taken: list[Message] = []
    with apps[0].connection_for_read() as connection:
        while (message := connection.default_channel.basic_get("any", no_ack=True)) is not None:
            taken.append(message)
    for app in apps:
        app.close()
    # Then all ten came through, each under a name and a delivery tag of its own
    assert sorted(m.headers["from"] for m in taken) == sorted(
        ["parent"] * 3 + ["child"] * 3 + ["parent again"] * 3 + ["other app"]
    )
    assert len(set(names)) == len(names) == 10
    assert len({m.delivery_tag for m in taken}) == 10


@dataclass
class OneSlotConsumer:
    """A consumer of queue "any" on the embedded broker with one prefetch slot, what it received so far."""

    settings: Settings
    connection: Connection
    transport: Transport
    received: list[Message]


@contextmanager
def one_slot_consumer(tmp_path: Path) -> Iterator[OneSlotConsumer]:
    """Two messages queued on the embedded broker, and a consumer with one prefetch slot over them."""
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    app = make_celery_app(settings)
    for n in (1, 2):
        app.send_task(TASK_PROCESS_BATCH, args=[1, [n]], queue="any", routing_key="any")
    received: list[Message] = []
    with app.connection_for_read() as connection:
        transport = connection.transport
        assert isinstance(transport, Transport)
        channel = connection.default_channel
        channel.basic_qos(prefetch_count=1)
        with Consumer(channel, [Queue("any")], callbacks=[lambda body, message: received.append(message)]):
            yield OneSlotConsumer(settings, connection, transport, received)
    app.close()


def test_a_full_node_waits_for_an_ack_without_polling_and_takes_the_next_message_at_once(
    tmp_path: Path,
) -> None:
    # Given a consumer with one prefetch slot, two messages queued, and an idle polling interval far
    # longer than the test
    with one_slot_consumer(tmp_path) as node:
        node.connection.drain_events(timeout=2)
        assert len(node.received) == 1 and node.transport._slots_full()
        node.transport.polling_interval = 30.0
        polls = 0
        cycle = node.transport.cycle
        assert cycle is not None
        real_get = cycle.get

        def counted_get(*args: Any, **kwargs: Any) -> Any:
            nonlocal polls
            polls += 1
            return real_get(*args, **kwargs)

        cycle.get = counted_get  # type: ignore[method-assign]
        # When its pool acks the first message 0.3 s later, on another thread (as Celery's does)
        acker = threading.Timer(0.3, node.received[0].ack)
        began = monotonic()
        acker.start()
        node.connection.drain_events(timeout=20)
        waited = monotonic() - began
        acker.join()
    # Then the second message came right after the ack, not at the next poll 30 s on
    assert len(node.received) == 2
    assert 0.25 <= waited < 5, waited
    # And the node did not poll while its slot was full: one poll before the wait, one after the ack
    # (a loop polling every 5 ms would have polled about 60 times)
    assert polls <= 3, polls


def test_a_node_with_a_free_slot_polls_fast_after_a_delivery_and_as_configured_when_idle(
    tmp_path: Path,
) -> None:
    with one_slot_consumer(tmp_path) as node:
        transport = node.transport
        # Then a node that has taken nothing is neither recent nor full
        assert not transport._recent(monotonic()) and not transport._slots_full()
        # When it takes the first message, its slot is full
        node.connection.drain_events(timeout=2)
        assert len(node.received) == 1 and transport._slots_full()
        # And once it acks, the slot is free, and it counts as recent for BUSY_S after its delivery
        node.received[0].ack()
        assert not transport._slots_full()
        assert transport._recent(monotonic())
        assert not transport._recent(monotonic() + 2 * transport.BUSY_S)
        # And an empty wait ends at the timeout, not at the next idle poll
        node.connection.drain_events(timeout=2)
        node.received[1].ack()
        began = monotonic()
        with pytest.raises(TimeoutError):
            node.connection.drain_events(timeout=0.01)
        assert monotonic() - began < node.settings.broker_polling_interval + 0.5
    assert len(node.received) == 2
