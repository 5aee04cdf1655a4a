"""The detq command line: help and examples everywhere, errors as one line with exit codes, tables, JSON."""

from __future__ import annotations

import gc
import json
import os
import ssl
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from cli.base import DetqCommand, DetqGroup
from cli.main import cli, main
from detq import __version__
from detq.settings import get_settings
from tests.support import write_jpeg


def _commands(group: click.Group, prefix: str = "detq") -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        path = f"{prefix} {name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from _commands(command, path)


ALL_COMMANDS = list(_commands(cli))
LEAF_COMMANDS = [(path, c) for path, c in ALL_COMMANDS if not isinstance(c, click.Group)]


@pytest.fixture()
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An embedded deployment in tmp_path, read fresh by the settings."""
    for name in list(os.environ):
        if name.startswith("DETQ_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DETQ_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


@pytest.mark.parametrize(("path", "command"), LEAF_COMMANDS, ids=[p for p, _ in LEAF_COMMANDS])
def test_every_command_has_help_an_example_and_help_on_every_option(
    path: str, command: click.Command
) -> None:
    assert isinstance(command, DetqCommand), f"{path} must be a DetqCommand (errors as one line)"
    assert command.help and command.get_short_help_str(limit=80), path
    assert command.epilog and "Examples:" in command.epilog and path in command.epilog, path
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            assert param.help, f"{path} {param.opts[0]} has no help text"


def test_a_command_runs_with_what_its_imports_made_frozen_for_the_garbage_collector() -> None:
    seen: list[int] = []
    command = DetqCommand("probe", callback=lambda: seen.append(gc.get_freeze_count()))
    gc.unfreeze()
    try:
        command.main([], standalone_mode=False)
    finally:
        gc.unfreeze()  # the rest of the test session collects as before
    assert seen and seen[0] > 10_000, seen


def test_groups_are_detq_groups_and_list_commands_by_role() -> None:
    assert all(isinstance(c, DetqGroup) for _, c in ALL_COMMANDS if isinstance(c, click.Group))
    assert cli.list_commands(click.Context(cli))[:6] == [
        "run",
        "enqueue",
        "status",
        "jobs",
        "export",
        "requeue",
    ]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"detq {__version__}"


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [(["enqueu", "x"], "Did you mean one of: 'enqueue', 'requeue'?"), (["status", "--jsn"], "--json")],
)
def test_a_typo_gets_usage_and_a_suggestion(
    argv: list[str], suggestion: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Usage: detq" in err and suggestion in err


def test_bad_values_are_usage_errors_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "/tmp", "--batch-size", "0"]) == 2
    assert "1<=x<=1024" in capsys.readouterr().err
    assert main(["worker", "--pool", "cpu", "-Q", "gpu,control"]) == 2
    assert "queues are gpu, cpu, any" in capsys.readouterr().err


def test_completion_script_for_each_shell(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in ("bash", "zsh", "fish"):
        assert main(["completion", shell]) == 0
        assert "_DETQ_COMPLETE" in capsys.readouterr().out


def test_bad_configuration_is_one_line_naming_the_variable(
    embedded: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DETQ_MICRO_BATCH", "zero")
    assert main(["jobs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("detq jobs: bad configuration: DETQ_MICRO_BATCH:")


def test_an_unreachable_database_is_one_line(
    embedded: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DETQ_DATABASE_URL", "postgresql://detq:secret@127.0.0.1:1/detq")
    assert main(["status"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("detq status: cannot reach the database at postgresql")
    assert "secret" not in err[0]


def test_jobs_status_and_export_on_a_real_embedded_ledger(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given no jobs, Then jobs says so
    assert main(["jobs"]) == 0
    assert capsys.readouterr().out.strip() == "no jobs yet"
    # When two images are enqueued (no worker: they stay queued)
    images = embedded / "images"
    images.mkdir()
    for name in ("a.jpg", "b.jpg"):
        write_jpeg(images / name, (32, 32))
    assert main(["enqueue", str(images), "--json"]) == 0
    queued = json.loads(capsys.readouterr().out)
    assert (queued["total"], queued["batches"]) == (2, 1)
    # Then jobs is a table with headers, and --json gives the same job
    assert main(["jobs"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["JOB", "STATE", "FINISHED", "TOTAL"]
    assert row.split()[:4] == [str(queued["job_id"]), "queued", "0", "2"]
    assert "demo_detector.pt" in row.split()  # the model by its file's name
    assert main(["jobs", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["job_id"], listed["state"], listed["pending"]) == (queued["job_id"], "queued", 2)
    # And status of an unknown job is one line with exit 1
    assert main(["status", "999"]) == 1
    assert capsys.readouterr().err.strip() == "detq status: no job 999"
    # And export and report without a job id take the latest, and say which
    assert main(["export", "--format", "jsonl"]) == 0
    out, err = capsys.readouterr()
    assert err.strip() == f"job {queued['job_id']} (the latest)" and len(out.strip().splitlines()) == 2
    assert main(["report", "-o", str(embedded / "r.html")]) == 0
    assert (
        f"job {queued['job_id']} (the latest)" in capsys.readouterr().err and (embedded / "r.html").exists()
    )


def test_a_folder_without_images_is_a_warning_and_json_names_the_unreadable_folders(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a folder that holds only a text file
    folder = embedded / "docs"
    folder.mkdir()
    (folder / "notes.txt").write_text("not an image")
    # When it is enqueued
    assert main(["enqueue", str(folder), "--json"]) == 0
    out, err = capsys.readouterr()
    # Then the (empty) job is made, and stderr says why it is empty and what detq reads
    payload = json.loads(out)
    assert (payload["total"], payload["unreadable_count"], payload["unreadable_folders"]) == (0, 0, [])
    assert err.strip() == (
        "detq enqueue: warning: no image files found (1 file of another type, such as notes.txt); "
        "detq reads .bmp, .gif, .jpeg, .jpg, .png, .tif, .tiff, .webp"
    )
    # And a folder with images gets no such warning
    write_jpeg(folder / "a.jpg", (32, 32))
    assert main(["enqueue", str(folder), "--pool", "any"]) == 0
    assert "warning" not in capsys.readouterr().err


def _folder_too_deep_to_list(root: Path) -> Path:
    """A chain of folders under root whose last one's path is longer than the system's PATH_MAX (4096
    bytes): made level by level through directory descriptors, it holds an image no scan can list, even
    one run as root."""
    name, fd = "d" * 250, os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    depth = 4400 // (len(name) + 1)  # past 4096 whatever the length of root
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open("deep.jpg", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    return root.joinpath(*[name] * depth)


def test_a_folder_the_scan_cannot_read_is_named_and_fails_the_wait(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a folder whose only image lies in a folder too deep to list
    folder = embedded / "deep"
    folder.mkdir()
    too_deep = _folder_too_deep_to_list(folder)
    # When it is enqueued and waited for
    code = main(["enqueue", str(folder), "--wait", "--json"])
    out, err = capsys.readouterr()
    payload = json.loads(out.strip().splitlines()[-1])
    # Then the first folder past the limit is named with the reason, on stderr and in the JSON
    unread = [row["folder"] for row in payload["unreadable_folders"]]
    assert payload["unreadable_count"] == 1 and len(unread) == 1
    assert too_deep.as_posix().startswith(unread[0]) and len(unread[0].encode()) > 4096
    assert payload["unreadable_folders"][0]["reason"] == "File name too long"
    assert f"warning: cannot read folder {unread[0]} (File name too long)" in err
    # And the wait ends with exit 4, as for images that failed: not every image under the folder is done
    assert (payload["total"], payload["state"], code) == (0, "finished", 4)
    # And the ledger keeps it: the job's status names the folder, in JSON and in text
    assert main(["status", str(payload["job_id"]), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["unreadable_count"], status["unreadable_folders"]) == (1, payload["unreadable_folders"])
    assert main(["status", str(payload["job_id"])]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"1 folder not read, their images in no job, such as {unread[0]} (File name too long)"
    )


def test_a_job_no_worker_can_take_says_how_to_start_one(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from db.ledger import open_ledger
    from db.models import utcnow
    from db.workers_repo import ROLE_NODE, WorkerIdentity, register_worker

    hint = "no worker is listening on queue cpu: start one with `detq worker --pool cpu`"
    images = embedded / "images"
    images.mkdir()
    write_jpeg(images / "a.jpg", (32, 32))
    # Given no worker, When a job is enqueued for the cpu pool
    assert main(["enqueue", str(images), "--pool", "cpu"]) == 0
    out, err = capsys.readouterr()
    # Then the job id stays the last line of stdout, and stderr says how to start a worker
    assert out.splitlines()[-1] == "1" and err.strip() == hint
    # And its status ends with the same hint
    assert main(["status"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == hint
    # When a live cpu node beats in the ledger
    with open_ledger(get_settings()) as led, led.sessions.begin() as session:
        node = WorkerIdentity(ROLE_NODE, "w@host", "host", "key", os.getpid(), "cpu")
        register_worker(session, node, utcnow())
    # Then status gives no hint, and --json never carries one
    assert main(["status"]) == 0
    assert "no worker" not in capsys.readouterr().out
    assert main(["status", "--json"]) == 0
    assert "no worker" not in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "coco", "coco-dataset"])
def test_export_of_an_unknown_job_fails_and_leaves_the_file_alone(
    embedded: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given an earlier results file
    target = embedded / "results.out"
    target.write_text("earlier results\n")
    # When a job that does not exist is exported over it
    assert main(["export", "999", "--format", fmt, "-o", str(target)]) == 1
    # Then the command fails in one line, and the file is as it was, with no partial file beside it
    assert capsys.readouterr().err.strip() == "detq export: no job 999"
    assert target.read_text() == "earlier results\n"
    assert sorted(p.name for p in embedded.iterdir() if p.name.startswith(".")) == []


def test_export_into_a_missing_folder_is_a_clear_error(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = embedded / "images"
    images.mkdir()
    write_jpeg(images / "a.jpg", (16, 16))
    assert main(["enqueue", str(images)]) == 0
    capsys.readouterr()
    assert main(["export", "1", "--format", "csv", "-o", str(embedded / "nowhere" / "r.csv")]) == 1
    err = capsys.readouterr().err.strip()
    missing = embedded / "nowhere"
    assert err == f"detq export: cannot write {missing / 'r.csv'}: folder {missing} does not exist"


def test_info_on_a_fresh_data_folder_says_no_ledger_yet(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a data folder nothing has used yet: detq info says where things are, and that no ledger is made
    assert main(["info", "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["schema"]["current"] is None and "no ledger yet" in described["schema"]["note"]
    assert described["workers"]["processes"] == 0
    assert main(["info"]) == 0
    assert "no ledger yet: the first detq run" in capsys.readouterr().out


def test_run_into_an_out_it_cannot_write_is_one_line_before_anything_starts(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (embedded / "in").mkdir()
    write_jpeg(embedded / "in" / "a.jpg", (64, 48))
    (embedded / "taken").write_text("a file where --out's parent would be")
    out = embedded / "taken" / "results"
    assert main(["run", str(embedded / "in"), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"detq run: cannot write to --out {out}: Not a directory"]
    assert main(["jobs", "--all", "--json"]) == 0 and json.loads(capsys.readouterr().out) == []  # no job made


def test_flower_listens_on_loopback_and_keeps_the_broker_url_off_the_command_line(
    embedded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli.admin import flower_command

    monkeypatch.setenv("DETQ_BROKER_URL", "rediss://:hunter2@queue:6380/0")
    monkeypatch.setenv("FLOWER_BASIC_AUTH", "from:the-shell")
    argv, env = flower_command(address="127.0.0.1", port=5555, auth="ops:secret")
    assert "--address=127.0.0.1" in argv and not any("hunter2" in arg or "secret" in arg for arg in argv)
    # The child reads the broker from detq's settings in its environment (cli.flower_app)
    assert argv[1:4] == ["-P", "-m", "cli.flower_app"]
    assert env["DETQ_BROKER_URL"] == "rediss://:hunter2@queue:6380/0"
    assert env["FLOWER_BASIC_AUTH"] == "ops:secret"
    # Without a sign-in (--no-auth), none: not even Flower's own variable from the shell
    assert "FLOWER_BASIC_AUTH" not in flower_command(address="127.0.0.1", port=5555, auth=None)[1]


def test_flowers_app_carries_a_rediss_urls_tls_settings_as_broker_use_ssl(
    embedded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli.flower_app import flower_app

    # Given a rediss:// broker whose URL names a private CA
    monkeypatch.setenv("DETQ_BROKER_URL", "rediss://queue:6380/0?ssl_ca_certs=/etc/detq/ca.pem")
    get_settings.cache_clear()
    # Then Flower's app holds them where Flower's own Redis connection reads them, checking the certificate
    options = flower_app(get_settings()).conf.broker_use_ssl
    assert options == {"ssl_ca_certs": "/etc/detq/ca.pem", "ssl_cert_reqs": ssl.CERT_REQUIRED}
    # And a plain redis:// broker gets none
    monkeypatch.setenv("DETQ_BROKER_URL", "redis://queue:6379/0")
    get_settings.cache_clear()
    assert flower_app(get_settings()).conf.broker_use_ssl is False  # Celery's default, untouched


def test_cancel_ends_pending_images_and_delete_removes_the_job(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a queued job of two images (no worker)
    images = embedded / "images"
    images.mkdir()
    for name in ("a.jpg", "b.jpg"):
        write_jpeg(images / name, (16, 16))
    assert main(["enqueue", str(images)]) == 0
    capsys.readouterr()
    # When it is cancelled, Then its images end cancelled and the job says so; --wait ends at once, code 4
    assert main(["cancel", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"job_id": 1, "cancelled": 2}
    assert main(["status", "1", "--json", "--wait"]) == 4
    status = json.loads(capsys.readouterr().out)
    assert (status["state"], status["pending"], status["cancelled"]) == ("cancelled", 0, 2)
    # And delete asks for --yes off a terminal, then removes it
    assert main(["delete", "1"]) == 1
    assert "without --yes" in capsys.readouterr().err
    assert main(["delete", "1", "--yes"]) == 0
    capsys.readouterr()
    assert main(["jobs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_jobs_hides_scheduled_runs_that_found_nothing_unless_all_but_not_runs_closed_early(
    embedded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import UTC, datetime

    from sqlalchemy.orm import Session

    from db.enqueue_repo import close_enqueue
    from db.jobs_repo import finish_enqueue, get_or_create_model
    from db.ledger import open_ledger
    from db.schedules_repo import RunKey, claim_run

    def nightly(s: Session, day: int, roots: list[str]) -> int:
        model = get_or_create_model(s, sha256="c" * 64, path="/m.pt", size_bytes=1, meta={})
        when = datetime(2026, 11, day, 2, tzinfo=UTC)
        run = claim_run(s, RunKey("nightly", when), model_id=model.id, roots=roots, pool="any", batch_size=16)
        assert run is not None
        return run

    with open_ledger(get_settings()) as led, led.sessions() as s, s.begin():
        run = nightly(s, 29, ["/d"])
        finish_enqueue(s, run, 0)
    assert main(["jobs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["jobs", "--all", "--json"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)] == [run]
    # A run closed early (its folder missing that night) queued nothing too, but is shown, with why
    with open_ledger(get_settings()) as led, led.sessions() as s, s.begin():
        closed = nightly(s, 30, ["/nas"])
        close_enqueue(s, closed, "nothing queued: not a folder: /nas", datetime.now(UTC))
    assert main(["jobs", "--json"]) == 0
    assert [j["job_id"] for j in json.loads(capsys.readouterr().out)] == [closed]
    assert main(["runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "closed early" in lines[1] and "nothing new" in lines[2]
    assert lines[-1] == f"job {closed} (nightly, 2026-11-30T02:00:00): nothing queued: not a folder: /nas"


def test_the_command_line_loads_a_commands_module_only_when_it_runs() -> None:
    import subprocess
    import sys

    code = (
        "import sys, cli.main\n"
        "heavy = [m for m in ('celery', 'sqlalchemy', 'torch', 'PIL', 'rich') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_enqueue_on_sqlite_imports_neither_the_postgresql_dialect_nor_rich(embedded: Path) -> None:
    """Its start-up delays the job's first task: what it does not use, it does not import."""
    import subprocess
    import sys

    photos = embedded / "photos"
    photos.mkdir()
    write_jpeg(photos / "a.jpg", (64, 48))
    code = (
        "import sys\n"
        "from cli.main import main\n"
        "assert main(['enqueue', sys.argv[1], '--json']) == 0\n"
        "unused = [m for m in ('sqlalchemy.dialects.postgresql', 'psycopg', 'rich') if m in sys.modules]\n"
        "assert not unused, unused\n"
        "assert 'sqlalchemy.dialects.sqlite' in sys.modules\n"
    )
    # The first command of a deployment creates its schema with Alembic, which imports every dialect; the
    # nightly enqueue is not the first.
    assert main(["db", "upgrade"]) == 0
    done = subprocess.run(
        [sys.executable, "-c", code, str(photos)], capture_output=True, text=True, timeout=120, cwd=embedded
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["total"] == 1
