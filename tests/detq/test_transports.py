"""The embedded broker never shows half a message, an unreadable one does not stop its consumer, a full
node takes its next message as soon as a slot frees, and a busy one polls fast."""

from __future__ import annotations

import json
import os
import ssl
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
from kombu.utils.json import dumps

from detq.celery_app import make_celery_app
from detq.contract import TASK_PROCESS_BATCH
from detq.settings import Settings
from detq.transports import FolderListing, RedisTransport, TlsRedisTransport, Transport, decode
from dispatch.broker import dead_letters


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
            TASK_PROCESS_BATCH, args=[1, [n + 1]], task_id=f"detq-batch-{n}", queue="any", routing_key="any"
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
    # Given one channel that sends three messages (to a queue that is not detq's: any message goes), is
    # copied into a forked process that sends three, and sends three more itself; and a second app's
    # channel that sends three
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    apps = [make_celery_app(settings), make_celery_app(settings)]
    with apps[0].connection_for_write() as connection:
        producer = Producer(connection.default_channel)

        def send(tag: str) -> None:
            for n in range(3):
                producer.publish(
                    {"n": n}, routing_key="names", headers={"from": tag}, declare=[Queue("names")]
                )

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
            {"n": 0}, routing_key="names", headers={"from": "other app"}, declare=[Queue("names")]
        )
    names = [path.name for path in (settings.broker_dir / "queue").glob("*.msg")]
    # When a consumer takes every message
    taken: list[Message] = []
    with apps[0].connection_for_read() as connection:
        while (message := connection.default_channel.basic_get("names", no_ack=True)) is not None:
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


# --- Messages no consumer of detq's can use are set aside, on both brokers


def _garbage(app: Any) -> dict[str, bytes]:
    """Raw queue entries of every kind a worker cannot run, keyed by what is wrong with them, made from a
    real batch message where they need one."""
    with app.producer_or_acquire() as producer:
        channel = producer.channel
        good = channel.prepare_message(
            dumps([[1, [2, 3]], {}, {}]), content_type="application/json", content_encoding="utf-8"
        )
    assert isinstance(good, dict)

    def altered(**changes: Any) -> bytes:
        message = json.loads(json.dumps(good))
        message["headers"] = {"id": "detq-batch-1", "task": TASK_PROCESS_BATCH, **changes.pop("headers", {})}
        message.update(changes)
        return json.dumps(message).encode()

    return {
        "not JSON": b"hello \x1b]0;pwned\x07 not json",
        "a JSON object": b'{"task": "detq.process_batch"}',
        "a JSON list": b"[1, 2, 3]",
        "pickled": altered(**{"content-type": "application/x-python-serialize"}),
        "another task": altered(headers={"task": "celery.backend_cleanup"}),
        "not a batch": altered(body=dumps([["../../etc", ["x"]], {}, {}])),
    }


def test_every_kind_of_garbage_is_refused_and_a_real_batch_message_accepted(tmp_path: Path) -> None:
    # Given the raw entries a typo in a shell, a stranger, or another program could leave on a queue
    app = make_celery_app(Settings(_env_file=None, data_dir=tmp_path / "data"))
    garbage = _garbage(app)
    app.close()
    # Then each is refused with its own reason
    reasons = {kind: decode("any", raw)[1] for kind, raw in garbage.items()}
    assert reasons["not JSON"] is not None and reasons["not JSON"].startswith("not JSON")
    assert reasons["a JSON list"] == "not a Celery message (a JSON list, not an object)"
    assert reasons["a JSON object"] == "not a Celery message (no headers, properties or body)"
    assert reasons["pickled"] == "content type 'application/x-python-serialize' refused: detq reads JSON only"
    assert (
        reasons["another task"]
        == "task 'celery.backend_cleanup' is not what queue any runs (detq.process_batch)"
    )
    assert reasons["not a batch"] is not None and reasons["not a batch"].startswith("not a batch: job_id")
    # And the message an enqueue sends is not (nor anything on a queue that is not detq's)
    good = _garbage_source_message(tmp_path)
    assert decode("any", good) == (json.loads(good), None)
    assert decode("celery.pidbox", garbage["a JSON list"]) == ([1, 2, 3], None)


def _garbage_source_message(tmp_path: Path) -> bytes:
    settings = Settings(_env_file=None, data_dir=tmp_path / "sent")
    app = make_celery_app(settings)
    app.send_task(
        TASK_PROCESS_BATCH, args=[1, [2, 3]], task_id="detq-batch-1", queue="any", routing_key="any"
    )
    app.close()
    (path,) = (settings.broker_dir / "queue").glob("*.msg")
    return path.read_bytes()


def test_the_embedded_broker_sets_garbage_aside_and_hands_on_the_batch_behind_it(tmp_path: Path) -> None:
    # Given the embedded queue holding one entry of each kind of garbage, ahead of a real batch message
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    app = make_celery_app(settings)
    garbage = _garbage(app)
    queue = settings.broker_dir / "queue"
    for n, raw in enumerate(garbage.values()):
        (queue / f"{n:020d}_garbage.any.msg").write_bytes(raw)
    app.send_task(TASK_PROCESS_BATCH, args=[1, [2]], task_id="detq-batch-9", queue="any", routing_key="any")
    # When a consumer reads the queue
    with app.connection_for_read() as connection:
        message = connection.default_channel.basic_get("any", no_ack=True)
        after = connection.default_channel.basic_get("any", no_ack=True)
    # Then the batch came through, and nothing else
    assert message is not None and message.headers["id"] == "detq-batch-9" and after is None
    assert list(queue.iterdir()) == []
    # And every piece of garbage is kept in dead/ with why, newest first, where detq info reads it
    found = dead_letters(app, settings, latest=len(garbage))
    app.close()
    assert found.count == len(garbage)
    assert sorted(entry["raw"] for entry in found.latest) == sorted(
        raw.decode("utf-8", errors="backslashreplace") for raw in garbage.values()
    )
    assert all(entry["queue"] == "any" and entry["reason"] and entry["at"] for entry in found.latest)


def test_the_embedded_broker_keeps_the_newest_set_aside_messages_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given room for three set-aside messages, and five pieces of garbage queued
    monkeypatch.setattr("detq.transports.DEAD_LETTERS_KEPT", 3)
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    app = make_celery_app(settings)
    for n in range(5):
        (settings.broker_dir / "queue" / f"{n:020d}_garbage.any.msg").write_bytes(f"junk {n}".encode())
    # When a consumer reads the queue
    with app.connection_for_read() as connection:
        assert connection.default_channel.basic_get("any", no_ack=True) is None
    found = dead_letters(app, settings, latest=5)
    app.close()
    # Then the three newest are kept
    assert found.count == 3
    assert [entry["raw"] for entry in found.latest] == ["junk 4", "junk 3", "junk 2"]


def test_the_folder_is_listed_once_for_many_messages_and_again_for_a_batch_sent_again(tmp_path: Path) -> None:
    # Given 300 messages in a folder, and a listing of it on a clock the test moves
    folder = tmp_path / "queue"
    folder.mkdir()
    for n in range(300):
        (folder / f"{n + 1:020d}_t-{n:09d}.any.msg").write_bytes(b"{}")
    (folder / f"{0:020d}_x.any.msg.partial").write_bytes(b"{")  # being written: never a name to take
    now = [100.0]
    listing = FolderListing(str(folder), clock=lambda: now[0])
    # When 200 are taken within one refresh period
    taken = [listing.next_name("any") for _ in range(200)]
    # Then in name order, from one listing; an empty queue does not list again within the spacing
    assert taken == [f"{n + 1:020d}_t-{n:09d}.any.msg" for n in range(200)]
    assert listing.listings == 1
    # When a batch is sent again (named to sort first) and the refresh period passes
    (folder / f"{0:020d}_{5:020d}_t-again.any.msg").write_bytes(b"{}")
    assert listing.next_name("any") == f"{201:020d}_t-{200:09d}.any.msg"
    now[0] += FolderListing.REFRESH_S
    # Then it is the next name taken
    assert listing.next_name("any") == f"{0:020d}_{5:020d}_t-again.any.msg"
    assert listing.listings == 2


def test_an_empty_queue_beside_a_deep_one_lists_the_folder_no_more_than_its_share_of_the_time(
    tmp_path: Path,
) -> None:
    # Given a folder whose listing took a measurable time (a clock that moves 0.1 s while it lists)
    folder = tmp_path / "queue"
    folder.mkdir()
    (folder / f"{1:020d}_t.gpu.msg").write_bytes(b"{}")
    now = [0.0]

    def clock() -> float:
        now[0] += 0.05
        return now[0]

    listing = FolderListing(str(folder), clock=clock)
    assert listing.next_name("any") is None and listing.listings == 1
    # When the empty queue is polled a hundred times in the next 0.5 s
    for _ in range(100):
        now[0] += 0.005 - 0.05
        assert listing.next_name("any") is None
    # Then the folder was not listed again: a listing that cost 0.05 s waits 1 s (5% of the time)
    assert listing.listings == 1


def test_redis_sets_garbage_aside_and_hands_on_the_batch_behind_it(redis_url: str, tmp_path: Path) -> None:
    import redis

    # Given detq's Redis queue holding every kind of garbage, pushed where kombu consumes next, and a
    # real batch message behind them
    settings = Settings(_env_file=None, data_dir=tmp_path / "data", broker_url=redis_url)
    app = make_celery_app(settings)
    garbage = _garbage(app)
    client = redis.Redis.from_url(redis_url)
    app.send_task(TASK_PROCESS_BATCH, args=[1, [2]], task_id="detq-batch-9", queue="any", routing_key="any")
    client.rpush("any", *garbage.values())  # kombu takes from the right: these come first
    received: list[Message] = []
    # When a consumer drains the queue on its event-driven read (BRPOP), as a worker does
    with app.connection_for_read() as connection:
        with Consumer(
            connection.default_channel, [Queue("any")], callbacks=[lambda b, m: received.append(m)]
        ):
            deadline = monotonic() + 10
            while not received and monotonic() < deadline:
                try:
                    connection.drain_events(timeout=1)
                except TimeoutError:
                    continue
        for message in received:
            message.ack()
    # Then the batch came through and the garbage is on detq.dead with its reasons, newest first
    assert [m.headers["id"] for m in received] == ["detq-batch-9"]
    found = dead_letters(app, settings, latest=10)
    assert found.count == len(garbage)
    # (taken from the right, last pushed first: the first pushed was set aside last)
    assert [entry["raw"] for entry in found.latest] == [
        raw.decode("utf-8", errors="backslashreplace") for raw in garbage.values()
    ]
    # And basic_get (kombu's other read) sets garbage aside as well
    client.rpush("any", b"\x00\xff garbage")
    with app.connection_for_read() as connection:
        assert connection.default_channel.basic_get("any", no_ack=True) is None
    assert dead_letters(app, settings).count == len(garbage) + 1
    client.close()
    app.close()


def test_redis_urls_get_the_checking_transport_with_their_tls_settings_kept(tmp_path: Path) -> None:
    # Given a rediss:// broker URL (kombu reads TLS from the scheme's query), and a plain one
    cases = (
        ("rediss://:pw@broker:6380/0", TlsRedisTransport, True, "rediss://:**@broker:6380/0"),
        ("redis://broker:6379/0", RedisTransport, False, "redis://:**@broker:6379/0"),
    )
    for url, transport, tls, shown in cases:
        app = make_celery_app(Settings(_env_file=None, data_dir=tmp_path / "data", broker_url=url))
        connection = app.connection_for_write()
        # Then the connection uses detq's Redis transport, certificates still checked over TLS
        assert connection.transport_cls is transport
        assert (connection.ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED}) if tls else not connection.ssl
        # And its URL, as Celery logs it and Flower reads it, has the scheme (not the class) in front
        assert connection.as_uri() == shown
        assert connection.as_uri(include_password=True).startswith(
            url.split("@")[0] if "@" in url else "redis://"
        )
        app.close()
