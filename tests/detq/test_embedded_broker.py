"""The embedded broker never shows half a message, an unreadable one does not stop its consumer, and a busy
node polls fast."""

from __future__ import annotations

from pathlib import Path
from time import monotonic

import pytest
from kombu import Consumer, Queue
from kombu.message import Message

from detq.celery_app import make_celery_app
from detq.contract import TASK_PROCESS_BATCH
from detq.embedded_broker import Transport
from detq.settings import Settings


def test_a_torn_message_file_is_dropped_and_the_next_one_delivered(tmp_path: Path) -> None:
    # Given the embedded broker's queue holding a message cut short (its producer was killed mid-write)
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")  # type: ignore[call-arg]
    app = make_celery_app(settings)
    queue = settings.broker_dir / "queue"
    (queue / f"{0:015d}_torn.any.msg").write_text('{"body": "abc')  # named as if written first
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


def test_a_busy_node_polls_fast_and_an_idle_one_as_configured(tmp_path: Path) -> None:
    # Given a consumer on the embedded broker with one prefetch slot, and two messages queued
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")  # type: ignore[call-arg]
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
            # Then a node that has taken nothing polls at the configured interval
            assert not transport._busy(monotonic())
            # When it takes the first message, its slot is full: it polls fast, even long after
            connection.drain_events(timeout=2)
            assert len(received) == 1 and transport._busy(monotonic() + 3 * transport.BUSY_S)
            # And once it acks, it polls fast only for BUSY_S after its last delivery
            received[0].ack()
            assert transport._busy(monotonic())
            assert not transport._busy(monotonic() + 2 * transport.BUSY_S)
            # And an empty wait ends at the timeout, not at the next idle poll
            connection.drain_events(timeout=2)
            began = monotonic()
            with pytest.raises(TimeoutError):
                connection.drain_events(timeout=0.01)
            assert monotonic() - began < settings.broker_polling_interval + 0.5
    app.close()
    assert len(received) == 2
