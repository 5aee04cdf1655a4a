"""Run real `detq` commands and `detq worker` processes for the integration tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import service_missing

DETQ = [sys.executable, "-m", "cli"]
# detq through the test wrapper: torch forbidden with DETQ_TEST_TORCH_MARK, sleeps fit for libfaketime.
WRAPPED_DETQ = [sys.executable, str(Path(__file__).resolve().parent / "no_torch_detq.py")]
READY_MARK = "ready on"
LOADED_MARK = "detq: loaded model"


@dataclass
class Deployment:
    """One detq installation: data dir, database, broker and model, as environment variables."""

    data_dir: Path
    database_url: str | None = None
    broker_url: str | None = None
    model: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DETQ_")}
        env["DETQ_DATA_DIR"] = str(self.data_dir)
        env["PYTHONUNBUFFERED"] = "1"
        if self.database_url:
            env["DETQ_DATABASE_URL"] = self.database_url
        if self.broker_url:
            env["DETQ_BROKER_URL"] = self.broker_url
        if self.model:
            env["DETQ_MODEL"] = str(self.model)
        env.update(self.extra)
        return env

    def run(
        self, *args: str, timeout: float = 300, codes: tuple[int, ...] = (0,)
    ) -> subprocess.CompletedProcess[str]:
        """Run one detq command; raise with its output when it exits with a code not in `codes`."""
        done = subprocess.run(
            [*DETQ, *args], env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode not in codes:
            raise AssertionError(
                f"detq {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def run_json(self, *args: str, timeout: float = 300, codes: tuple[int, ...] = (0,)) -> Any:
        """Run a detq command with --json and parse its one JSON line."""
        done = self.run(*args, "--json", timeout=timeout, codes=codes)
        return json.loads(done.stdout.strip().splitlines()[-1])

    def job_status(self, job_id: int) -> dict[str, Any]:
        """What `detq status JOB --json` prints, read from the ledger in this process (producer.status,
        the command's own function), with this deployment's settings. For polls: a command costs 0.3 s of
        CPU to start, and a poll every half second took that from the workers it waits on, on two cores.
        Raises where the ledger cannot be read."""
        from db.ledger import open_ledger
        from detq.settings import SETTING_NAMES, Settings
        from producer.status import job_status

        given = {k[len("DETQ_") :].lower(): v for k, v in self.env().items() if k.startswith("DETQ_")}
        settings = Settings(_env_file=None, **{k: v for k, v in given.items() if k in SETTING_NAMES})
        with open_ledger(settings, check_schema=False) as led, led.reads() as session:
            return job_status(session, job_id).as_dict()


@dataclass
class WorkerHandle:
    """A running `detq worker` and its log."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, count: int = 1, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log().count(text) >= count:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited {self.proc.returncode}:\n{self.log()[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(
            f"{text!r} x{count} not seen in the worker log within {timeout} s:\n{self.log()[-4000:]}"
        )


def faked_clock(offset: str) -> dict[str, str]:
    """The environment that runs a process with its wall clock shifted by offset, its monotonic clock
    left alone (libfaketime preloaded: the process itself, not under a `faketime` parent that would take
    the signals meant for it). Run a detq that sleeps through no_torch_detq.py (libfaketime issue 426)."""
    libraries = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not libraries:
        service_missing("libfaketime", FileNotFoundError("apt-get install faketime"))
    return {
        "LD_PRELOAD": str(libraries[0]),
        "FAKETIME": offset,
        "DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "DETQ_TEST_FAKED_CLOCK": "1",
    }


@contextmanager
def running_worker(
    deployment: Deployment,
    *,
    pool: str = "cpu",
    concurrency: int = 2,
    wait_ready: bool = True,
    name: str = "w",
    loglevel: str = "INFO",
    command: Sequence[str] = DETQ,
    env: Mapping[str, str] | None = None,
) -> Iterator[WorkerHandle]:
    """Start `detq worker` (by command, with env added to the deployment's), wait until every pool process
    has loaded the model, stop it warmly afterwards."""
    log_path = deployment.data_dir / f"worker-{name}-{time.monotonic_ns()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [*command, "worker", "--pool", pool, "--concurrency", str(concurrency), "--loglevel", loglevel],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=deployment.env() | dict(env or {}),
            start_new_session=True,
        )
    handle = WorkerHandle(proc, log_path)
    try:
        if wait_ready:
            handle.wait_for(READY_MARK, count=concurrency)
        yield handle
    except AssertionError as exc:
        # A test that fails inside a worker's lifetime shows what the worker said, for CI's log.
        raise AssertionError(f"{exc}\n--- log of worker {name} (tail) ---\n{handle.log()[-6000:]}") from exc
    finally:
        stop_worker(handle)


def stop_worker(handle: WorkerHandle, timeout: float = 60) -> None:
    """SIGTERM (Celery warm shutdown), then SIGKILL the whole process group if it hangs."""
    if handle.proc.poll() is None:
        handle.proc.send_signal(signal.SIGTERM)
        try:
            handle.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(handle.proc.pid, signal.SIGKILL)
            handle.proc.wait()
