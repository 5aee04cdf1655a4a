"""Workers started on this machine for one command (`detq run`, `detq demo`): start, wait ready, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from detq.display import visible
from detq.errors import DetqError
from detq.host import python_command
from detq.settings import Settings
from detq.vocabulary import WorkerPool
from producer.progress import WaitTimeout

READY_MARK = "ready on"
# The line `detq worker` prints for a warning at its start (worker.pool.WARNING_MARK after its command name)
START_WARNING = "detq worker: warning: "
START_TIMEOUT_S = 180.0


class LocalWorkersFailed(DetqError):
    """The workers started here exited or never became ready."""


class LocalWorkers:
    """`with LocalWorkers(settings, pool, processes, log_path):` a `detq worker` child process, ready on
    entry, warm-stopped (SIGTERM: the batch in hand finishes) on exit."""

    def __init__(self, settings: Settings, pool: WorkerPool, processes: int | None, log_path: Path) -> None:
        self.settings = settings
        self.pool = pool
        self.processes = processes
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalWorkers:
        self.start()
        self.wait_ready()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start `detq worker` with these settings, its output in log_path."""
        env = dict(os.environ)
        env.update(
            DETQ_DATA_DIR=str(self.settings.resolved_data_dir),
            DETQ_DATABASE_URL=self.settings.resolved_database_url,
            DETQ_BROKER_URL=self.settings.resolved_broker_url,
            DETQ_MODEL=str(self.settings.model),
            DETQ_AS_SAVED=str(self.settings.as_saved).lower(),  # `detq run --as-saved`
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = python_command("-m", "cli", "worker", "--pool", self.pool.value)
        if self.processes is not None:  # else the worker's own default: cores, or one per GPU
            command += ["--concurrency", str(self.processes)]
        with self.log_path.open("wb") as log_file:
            # A session of its own: Ctrl-C in the terminal reaches this process, which stops them warmly.
            self.proc = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def wait_ready(
        self, until: float | None = None, on_wait: Callable[[int, int], None] | None = None
    ) -> None:
        """Return once every pool process has loaded the model; LocalWorkersFailed otherwise, and
        WaitTimeout past `until` (a time.monotonic() deadline: `detq run --timeout`). on_wait(ready,
        expected) is called at each look at the log, for progress."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        expected = self.processes or 1
        while time.monotonic() < deadline:
            if until is not None and time.monotonic() >= until:
                raise WaitTimeout("timed out while the workers were still loading the model")
            text = self.log_path.read_text(errors="replace")
            ready = text.count(READY_MARK)
            if on_wait is not None:
                on_wait(min(ready, expected), expected)
            if ready >= expected:
                return
            if self.proc.poll() is not None:
                tail = "\n".join(text.strip().splitlines()[-5:])
                raise LocalWorkersFailed(f"workers exited with code {self.proc.returncode}:\n{tail}")
            time.sleep(0.2)
        raise LocalWorkersFailed(f"workers not ready after {START_TIMEOUT_S:.0f} s; see {self.log_path}")

    def warnings(self) -> list[str]:
        """The workers' own warnings that concern the user (detq's: a format guessed, an optimisation left
        off, a rewrite that fell back), each once, as the log has them."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        found: dict[str, None] = {}
        for line in text.splitlines():
            if "WARNING" in line and "] detq: " in line:
                found[line.split("] detq: ", 1)[1].strip()] = None
            elif line.startswith(START_WARNING):  # said by the worker's main process before Celery logs
                found[line.removeprefix(START_WARNING).strip()] = None
        return [visible(line) for line in found]

    def check_alive(self) -> None:
        """LocalWorkersFailed if the workers exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise LocalWorkersFailed(f"workers exited with code {self.proc.returncode}; see {self.log_path}")

    def stop(self) -> None:
        """SIGTERM (Celery's warm shutdown), SIGKILL to the whole group if they hang."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
