"""docker-compose.yml validates, starts on a fresh clone, runs as a non-root user with health checks, and
names only commands the CLI has."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.parsing import parse_command_line
from tests.conftest import service_missing

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
LONG_RUNNING = ("redis", "postgres", "worker-cpu", "worker-gpu", "scheduler", "flower")


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
        "cli",
    } <= services.keys()


def test_docker_compose_validates_the_file() -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        service_missing("docker-compose", FileNotFoundError("apt-get install docker-compose"))
    # The default profile, and with every optional service
    for profiles in ([], ["--profile", "gpu", "--profile", "scheduler", "--profile", "cli"]):
        done = subprocess.run(
            [str(binary), "-f", str(COMPOSE), *profiles, "config", "-q"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={"PATH": "/usr/bin:/bin"},  # no DETQ_* from the caller: the defaults must do
        )
        assert done.returncode == 0, done.stderr


def test_a_fresh_clone_needs_no_file_that_is_not_in_the_repository(services: dict[str, Any]) -> None:
    # The default model is the bundled one (an empty DETQ_MODEL means the default); a host shell's own
    # DETQ_MODEL (a host path) never reaches the containers
    assert services["worker-cpu"]["environment"]["DETQ_MODEL"] == "${DETQ_COMPOSE_MODEL:-}"
    # The scheduler starts only when asked for, and its default schedules file exists
    assert services["scheduler"]["profiles"] == ["scheduler"]
    (schedules,) = [v for v in services["scheduler"]["volumes"] if v.endswith(":/etc/detq/schedules.toml:ro")]
    default = schedules.split(":-", 1)[1].split("}", 1)[0]
    assert (ROOT / default).is_file()


def test_long_running_services_have_health_checks_and_flower_stays_on_loopback(
    services: dict[str, Any],
) -> None:
    for name in LONG_RUNNING:
        assert services[name]["healthcheck"]["test"], name
    assert services["flower"]["ports"] == ["127.0.0.1:5555:5555"]


def test_images_run_as_a_user_and_only_the_worker_image_carries_torch(services: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    slim, worker = dockerfile.split("FROM slim AS worker")
    assert "USER detq" in slim and worker.rstrip().endswith("USER detq")
    assert "[worker" not in slim and "'.[worker,flower]'" in worker
    for name, service in services.items():
        target = service.get("build", {}).get("target") if isinstance(service.get("build"), dict) else None
        if name.startswith("worker-"):
            assert target == "worker", name
        elif "build" in service:
            assert target == "slim", name


def test_one_scheduler_with_its_schedules_file(services: dict[str, Any]) -> None:
    scheduler = services["scheduler"]
    assert scheduler["command"] == ["detq", "scheduler"]
    assert scheduler["deploy"]["replicas"] == 1 and scheduler["profiles"] == ["scheduler"]
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


def test_the_build_context_leaves_out_the_virtual_environment_and_keeps_what_the_images_copy() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip()[:1] not in ("", "#")
    }
    assert {".venv", ".git", "images", "models"} <= ignored
    copied = [
        line.split()[1]
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
    ]
    assert copied and not any(source.rstrip("/") in ignored for source in copied)


def test_the_worker_image_pins_torch_and_builds_cpu_only_on_request(services: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ARG TORCH_SPEC="torch>=2.14,<2.15 torchvision>=0.29,<0.30"' in dockerfile
    assert "ARG TORCH_INDEX_URL=" in dockerfile and '--index-url "$TORCH_INDEX_URL"' in dockerfile
    assert services["worker-cpu"]["build"]["args"] == {"TORCH_INDEX_URL": "${DETQ_TORCH_INDEX_URL:-}"}
