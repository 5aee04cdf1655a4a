"""The embedded broker never shows half a message, and an unreadable one does not stop its consumer."""

from __future__ import annotations

from pathlib import Path

from detq.celery_app import make_celery_app
from detq.contract import TASK_PROCESS_BATCH
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
