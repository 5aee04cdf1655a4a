"""Throwaway Redis and PostgreSQL servers for tests that stop them; the shared services are never touched."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import service_missing


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ThrowawayRedis:
    """redis-server on its own port, without persistence: a restart loses what was queued."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            service_missing("redis-server", FileNotFoundError("redis-server not on PATH"))
        self.binary = str(binary)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def listen_arguments(self) -> list[str]:
        """How redis-server listens: plain TCP on self.port."""
        return ["--port", str(self.port)]

    def start(self) -> None:
        command = [
            self.binary,
            *self.listen_arguments(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


class ThrowawayTlsRedis(ThrowawayRedis):
    """redis-server speaking only TLS, its certificate for 127.0.0.1 signed by a CA of its own (ca_file)."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        if shutil.which("openssl") is None:
            service_missing("openssl", FileNotFoundError("openssl not on PATH"))
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca_file = folder / "ca.crt"
        self._make_certificates()

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def _make_certificates(self) -> None:
        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=self.folder, check=True, capture_output=True)

        key = ("-newkey", "rsa:2048", "-nodes")
        openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=ca")
        openssl("req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
        (self.folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
        openssl(
            "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "san.cnf",
        )  # fmt: skip

    def listen_arguments(self) -> list[str]:
        """TLS only on self.port (no plain port), with this server's certificate."""
        return [
            *("--port", "0", "--tls-port", str(self.port)),
            *("--tls-cert-file", str(self.folder / "server.crt")),
            *("--tls-key-file", str(self.folder / "server.key")),
            *("--tls-ca-cert-file", str(self.ca_file), "--tls-auth-clients", "no"),
        ]


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary folder, run as the postgres user on its own port."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found or shutil.which("runuser") is None:
            service_missing("PostgreSQL binaries", FileNotFoundError("no initdb under /usr/lib/postgresql"))
        self.bin = Path(found[-1]).parent
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="detq-pg-"))
        shutil.chown(self.folder, "postgres", "postgres")
        self.data = self.folder / "data"
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres")
        if settings:  # postgresql.conf's later lines win
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.writelines(f"{name} = {value}\n" for name, value in settings.items())

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *command: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *command], check=True, capture_output=True, timeout=120
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
        # -l: the server's output goes to a file, not to the pipe this process waits on.
        log = str(self.folder / "server.log")
        self._as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", log, "-o", options, "-w", "start"
        )

    def stop(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)


def wait_for_port(port: int, timeout: float = 30) -> None:
    """Return once something listens on the port on 127.0.0.1; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"nothing listens on port {port} after {timeout} s")


class ThrowawayPgBouncer:
    """PgBouncer in transaction mode on its own port, in front of a PostgreSQL server: each transaction may
    run on any of its server connections (at most pool_size), as a fleet behind one pooler sees them."""

    def __init__(self, server_url: str, pool_size: int = 2) -> None:
        binary = shutil.which("pgbouncer") or shutil.which("/usr/sbin/pgbouncer")
        if binary is None:
            service_missing("pgbouncer", FileNotFoundError("apt-get install pgbouncer"))
        self.binary = str(binary)
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="detq-pgbouncer-"))
        self.folder.chmod(0o755)  # read by the postgres user it runs as when started by root
        server = make_url(server_url)
        user = server.username or "postgres"
        config = self.folder / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.folder / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
        )
        (self.folder / "users.txt").write_text(f'"{user}" ""\n')
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    def url_for(self, database_url: str) -> str:
        """database_url's database, reached through this pooler."""
        through = make_url(database_url).set(host="127.0.0.1", port=self.port)
        return through.render_as_string(hide_password=False)

    def start(self) -> None:
        run_as = ["-u", "postgres"] if os.geteuid() == 0 else []  # PgBouncer refuses to run as root
        self._log = open(self.folder / "pgbouncer.log", "wb")  # noqa: SIM115 - the server's, for its life
        command = [self.binary, *run_as, str(self.folder / "pgbouncer.ini")]
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=self._log)
        wait_for_port(self.port)

    def log(self) -> str:
        """What PgBouncer wrote so far."""
        return (self.folder / "pgbouncer.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
