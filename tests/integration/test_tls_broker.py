"""Redis over TLS: a job runs where the URL names the server's CA, and an unverifiable server is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.shapes import write_dataset
from tests.integration.harness import Deployment, running_worker
from tests.integration.servers import ThrowawayTlsRedis

pytestmark = pytest.mark.integration


def test_a_job_runs_over_tls_to_a_redis_whose_ca_the_url_names(
    tls_redis: ThrowawayTlsRedis, tmp_path: Path
) -> None:
    # Given a deployment whose broker is that Redis over TLS, its CA named in the URL
    images = tmp_path / "images"
    write_dataset(images, 6, seed=3)
    url = f"{tls_redis.url}?ssl_ca_certs={tls_redis.ca_file}"
    deployment = Deployment(tmp_path / "data", broker_url=url)
    # When a worker runs a job enqueued there
    with running_worker(deployment, concurrency=1):
        status = deployment.run_json("enqueue", str(images), "--wait", "--timeout", "180")
    # Then every image is done
    assert status["total"] == status["done"] == 6


def test_a_bare_rediss_url_checks_the_certificate_and_refuses_a_server_it_cannot_verify(
    tls_redis: ThrowawayTlsRedis, tmp_path: Path
) -> None:
    # Given a rediss:// URL that names no CA for a server whose certificate the system's CAs did not sign
    images = tmp_path / "images"
    write_dataset(images, 2, seed=3)
    deployment = Deployment(tmp_path / "data", broker_url=tls_redis.url)
    # When a job is enqueued
    refused = deployment.run("enqueue", str(images), codes=(1,))
    # Then the command says why, and how to name a private CA, in one line; and no job was made
    assert "certificate verify failed" in refused.stderr
    assert "ssl_ca_certs=" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert deployment.run_json("jobs") == []


def test_a_worker_stops_at_start_up_when_the_broker_certificate_is_refused(
    tls_redis: ThrowawayTlsRedis, tmp_path: Path
) -> None:
    # Given a worker whose bare rediss:// URL cannot verify the server (a permanent error, where a
    # broker that is down is worth waiting for)
    deployment = Deployment(tmp_path / "data", broker_url=tls_redis.url)
    # When it starts
    done = deployment.run("worker", "--pool", "cpu", "--concurrency", "1", timeout=120, codes=(3,))
    # Then it stops at once (exit 3) with the reason and the fix, instead of retrying for ever
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("detq worker: cannot use the broker:")
    assert "certificate verify failed" in line and "ssl_ca_certs=" in line
