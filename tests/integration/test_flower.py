"""`detq flower` for real: Flower on the Redis broker, behind basic auth, sees a running detq worker; on a
TLS-only Redis too, its queue lengths included."""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import DETQ, Deployment, WorkerHandle, running_worker
from tests.integration.servers import ThrowawayTlsRedis, free_port, wait_for_port

pytestmark = pytest.mark.integration

AUTH = "ops:secret"


def _get(port: int, path: str, auth: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), b""


def _workers(port: int) -> dict[str, Any]:
    status, body = _get(port, "/api/workers?refresh=1", AUTH)
    assert status == 200, status
    found = json.loads(body)
    assert isinstance(found, dict)
    return found


def _node(worker: WorkerHandle) -> str:
    return f"cpu-{worker.proc.pid}@{socket.gethostname()}"  # detq's default node name


def _wait_for_node(port: int, node: str) -> None:
    deadline = time.monotonic() + 60
    names: list[str] = []
    while time.monotonic() < deadline and node not in names:
        names = list(_workers(port))
        time.sleep(1)
    assert node in names, (node, names)


@contextmanager
def _flower(
    deployment: Deployment, port: int, *flags: str, said: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`detq flower` on this deployment's broker, listening on port (its standard error in `said`);
    SIGTERM afterwards if still running."""
    with open(said or "/dev/null", "wb") as err:
        flower = subprocess.Popen(
            [*DETQ, "flower", "--port", str(port), *flags],
            env=deployment.env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for_port(port)
        yield flower
    finally:
        if flower.poll() is None:
            flower.send_signal(signal.SIGTERM)
            flower.wait(timeout=30)


def test_flower_asks_for_credentials_and_lists_a_running_worker(redis_url: str, tmp_path: Path) -> None:
    # Given a detq worker on Redis, and `detq flower` on the same broker with basic auth
    deployment = Deployment(tmp_path / "data", broker_url=redis_url, extra={"DETQ_FLOWER_BASIC_AUTH": AUTH})
    port = free_port()
    with running_worker(deployment, concurrency=1) as worker, _flower(deployment, port) as flower:
        # When it is asked without credentials, and with them
        denied, _ = _get(port, "/")
        allowed, _ = _get(port, "/", AUTH)
        # Then only the second gets the page
        assert (denied, allowed) == (401, 200)
        # And the worker's node shows in its list within a few refreshes
        _wait_for_node(port, _node(worker))
        # And SIGTERM to `detq flower` stops Flower itself: nothing listens on its port afterwards
        flower.send_signal(signal.SIGTERM)
        code = flower.wait(timeout=30)
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), code


def test_flower_without_a_configured_sign_in_makes_one_and_says_it_once(
    redis_url: str, tmp_path: Path
) -> None:
    # Given no DETQ_FLOWER_BASIC_AUTH
    deployment = Deployment(tmp_path / "data", broker_url=redis_url)
    port = free_port()
    said = tmp_path / "flower.err"
    with _flower(deployment, port, said=said):
        # When its pages are asked for without credentials, with the password it printed, and a wrong one
        lines = said.read_text().splitlines()
        made = [line for line in lines if line.startswith("detq flower: sign in as detq with password ")]
        assert len(made) == 1, lines
        password = made[0].split("password ", 1)[1].split(" ", 1)[0]
        statuses = [_get(port, "/")[0], _get(port, "/", f"detq:{password}")[0], _get(port, "/", "detq:x")[0]]
    # Then only the password it made opens them
    assert statuses == [401, 200, 401]
    # And --no-auth serves without a sign-in, saying so
    port = free_port()
    with _flower(deployment, port, "--no-auth", said=said):
        assert _get(port, "/")[0] == 200
    assert "--no-auth: whoever reaches 127.0.0.1:" in said.read_text()


def test_flower_on_a_tls_only_redis_whose_ca_the_url_names_shows_the_worker_and_the_queues(
    tls_redis: ThrowawayTlsRedis, tmp_path: Path
) -> None:
    # Given a worker and `detq flower` on a Redis that speaks TLS only, its private CA named in the URL
    url = f"{tls_redis.url}?ssl_ca_certs={tls_redis.ca_file}"
    deployment = Deployment(tmp_path / "data", broker_url=url, extra={"DETQ_FLOWER_BASIC_AUTH": AUTH})
    port = free_port()
    with running_worker(deployment, concurrency=1) as worker, _flower(deployment, port):
        _wait_for_node(port, _node(worker))
        # When its API is asked for the queues' lengths, which Flower reads over a Redis connection of its own
        status, body = _get(port, "/api/queues/length", AUTH)
    # Then they come back (that connection checked the server's certificate against the same CA) with the
    # worker's queue among them
    assert status == 200, status
    queues = json.loads(body)["active_queues"]
    assert "cpu" in {queue["name"] for queue in queues}, queues
