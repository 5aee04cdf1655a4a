"""docker-compose.yml parses, has the services a cluster needs, and names only commands the CLI has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.detq.cli.parsing import parse_command_line

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return dict(document["services"])


def test_expected_services(services: dict[str, Any]) -> None:
    assert {
        "redis",
        "postgres",
        "migrate",
        "worker-cpu",
        "worker-gpu",
        "flower",
        "scheduler",
    } <= services.keys()


def test_one_scheduler_with_its_schedules_file(services: dict[str, Any]) -> None:
    scheduler = services["scheduler"]
    assert scheduler["command"] == ["detq", "scheduler"]
    assert scheduler["deploy"]["replicas"] == 1
    assert scheduler["environment"]["DETQ_SCHEDULES_FILE"] == "/etc/detq/schedules.toml"
    assert scheduler["environment"]["DETQ_DATABASE_URL"].startswith("postgresql://")
    assert scheduler["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_redis_persists_and_never_evicts(services: dict[str, Any]) -> None:
    command = services["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_postgres_has_healthcheck_and_migrate_waits_for_it(services: dict[str, Any]) -> None:
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for worker in ("worker-cpu", "worker-gpu"):
        assert services[worker]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_gpu_worker_reserves_nvidia_devices(services: dict[str, Any]) -> None:
    (device,) = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert services["worker-gpu"]["command"][-2:] == ["--pool", "gpu"]
    assert services["worker-cpu"]["command"][-2:] == ["--pool", "cpu"]


def test_every_detq_command_exists_in_the_cli(services: dict[str, Any]) -> None:
    commands = [s["command"] for s in services.values() if s.get("command") and s["command"][0] == "detq"]
    assert len(commands) >= 4
    for command in commands:
        parse_command_line(command[1:])  # raises (fails the test) on an unknown command or option


def test_cluster_env_points_at_the_shared_services(services: dict[str, Any]) -> None:
    env = services["worker-cpu"]["environment"]
    assert env["DETQ_BROKER_URL"].startswith("redis://redis:")
    assert env["DETQ_DATABASE_URL"].startswith("postgresql://")
