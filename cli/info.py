"""Where things are and who is working: `detq info` and `detq workers`."""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from pathlib import Path
from typing import Any

import click
from kombu.utils.url import maybe_sanitize_url

from cli.base import DetqCommand, examples, load_settings
from cli.output import print_json, table
from db.clock import ledger_now
from db.ledger import open_ledger
from db.migrate import current_revision, head_revision
from detq import __version__
from detq.celery_app import make_celery_app
from detq.display import visible
from detq.errors import DetqError
from detq.settings import Settings
from detq.transports import DEAD_LETTER_FOLDER, DEAD_LETTER_KEY
from dispatch.broker import dead_letters
from producer.fleet import WorkerView, fleet

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _describe(settings: Settings) -> dict[str, Any]:
    """Everything `detq info` says, without importing torch or touching a worker."""
    database = settings.resolved_database_url
    model = settings.model
    env_file = Path(".env").resolve()
    info: dict[str, Any] = {
        "version": __version__,
        "versions": {
            "python": platform.python_version(),
            **{name: _version(name) for name in ("celery", "kombu", "sqlalchemy", "torch", "torchvision")},
        },
        "data_dir": str(settings.resolved_data_dir),
        "database": maybe_sanitize_url(database),
        "broker": "embedded, in " + str(settings.broker_dir)
        if settings.is_embedded_broker
        else maybe_sanitize_url(settings.resolved_broker_url),
        "model": {
            "path": str(model),
            "exists": model.is_file(),
            "size_bytes": model.stat().st_size if model.is_file() else None,
        },
        "settings_file": str(env_file) if env_file.is_file() else None,
        "variables_set": sorted(name for name in os.environ if name.startswith("DETQ_")),
    }
    with open_ledger(settings, check_schema=False) as led:
        current, needed = current_revision(led.engine), head_revision()
        info["schema"] = {"current": current, "needed": needed}
        views: list[WorkerView] = []
        if current is None:  # a fresh data folder: nothing has made the ledger yet
            info["schema"]["note"] = "no ledger yet: the first detq run, enqueue or worker creates it"
        elif current != needed:  # its workers table may lack what this version reads
            info["schema"]["note"] = f"the ledger is at revision {current}: run detq db upgrade"
        else:
            with led.reads() as session:
                views = fleet(session, ledger_now(session), timeout_s=settings.worker_timeout)
    info["set_aside"] = _set_aside(settings)
    alive = [v for v in views if v.state == "alive"]
    info["workers"] = {
        "nodes": sorted({f"{v.node} ({v.pool})" for v in alive if v.role == "node"}),
        "processes": sum(1 for v in alive if v.role == "process"),
        "images_per_s": round(sum(v.images_per_s for v in alive if v.role == "process"), 2),
    }
    return info


def _set_aside(settings: Settings) -> dict[str, Any]:
    """The messages the broker's consumers set aside (not JSON, not a detq task...), newest first."""
    # The embedded broker's are files: no app, which would make the broker's folders in a fresh data dir.
    app = None if settings.is_embedded_broker else make_celery_app(settings)
    try:
        found = dead_letters(app, settings)
    except Exception as exc:  # noqa: BLE001 - a broker that does not answer: info still tells the rest
        return {"count": None, "latest": [], "error": f"cannot read the broker: {exc}"}
    finally:
        if app is not None:
            app.close()
    where = (
        str(settings.broker_dir / DEAD_LETTER_FOLDER) if app is None else f"the Redis list {DEAD_LETTER_KEY}"
    )
    return {"count": found.count, "latest": found.latest, "where": where}


@click.command(cls=DetqCommand, epilog=examples("detq info", "detq info --json"))
@JSON_OPTION
def info(as_json: bool) -> None:
    """Where the ledger, broker, model and settings are, the versions, and which workers are alive."""
    described = _describe(load_settings())
    if as_json:
        print_json(described)
        return
    versions = ", ".join(f"{k} {v}" for k, v in described["versions"].items() if v)
    model = described["model"]
    schema = described["schema"]
    workers = described["workers"]
    size = f"{model['size_bytes'] / 1e6:.1f} MB" if model["exists"] else "MISSING"
    up_to_date = schema.get("note") or ("up to date" if schema["current"] == schema["needed"] else "")
    rows = [
        ("detq", f"{described['version']} ({versions})"),
        ("data dir", described["data_dir"]),
        ("database", f"{described['database']} (schema {schema['current'] or 'none'}, {up_to_date})"),
        ("broker", described["broker"]),
        ("set aside", _set_aside_line(described["set_aside"])),
        ("model", f"{model['path']} ({size})"),
        ("settings file", described["settings_file"] or "none (.env in this folder)"),
        ("DETQ_ variables", ", ".join(described["variables_set"]) or "none"),
        (
            "workers",
            f"{len(workers['nodes'])} alive ({', '.join(workers['nodes']) or 'none'}), "
            f"{workers['processes']} pool processes, {workers['images_per_s']} images/s",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        click.echo(f"{name.ljust(width)}  {value}")


def _set_aside_line(found: dict[str, Any]) -> str:
    if found["count"] is None:
        return visible(found["error"])
    if not found["count"]:
        return f"none (a message no worker can use would be kept in {found['where']})"
    newest = found["latest"][0] if found["latest"] else {}
    return visible(
        f"{found['count']} messages no worker could use, in {found['where']}; the newest"
        f" {newest.get('at', '?')} on queue {newest.get('queue', '?')}: {newest.get('reason', '?')}"
    )


@click.command(
    cls=DetqCommand, epilog=examples("detq workers", "detq workers --all --json", "detq workers --check")
)
@click.option("--all", "show_all", is_flag=True, help="Also the workers stopped or lost in the last hour.")
@click.option(
    "--check",
    is_flag=True,
    help="Exit 0 if a live worker node runs on this host, 1 if none (a container health check).",
)
@JSON_OPTION
def workers(show_all: bool, check: bool, as_json: bool) -> None:
    """The fleet from its heartbeats: nodes and pool processes, device, model, rate, last seen."""
    settings = load_settings()
    with open_ledger(settings) as led, led.reads() as session:
        views = fleet(
            session, ledger_now(session), timeout_s=settings.worker_timeout, include_stopped=show_all
        )
    if check:
        here = [
            v for v in views if v.role == "node" and v.state == "alive" and v.host == socket.gethostname()
        ]
        if not here:
            raise DetqError(f"no live worker node on {socket.gethostname()}")
        click.echo(f"{len(here)} live worker node(s) here: {', '.join(v.node for v in here)}")
        return
    if as_json:
        print_json([v.as_dict() for v in views])
        return
    if not views:
        click.echo("no workers are running (start one with `detq worker --pool cpu`)")
        return
    click.echo(table(_HEADERS, [_row(v) for v in views]))


_HEADERS = (
    "id",
    "node",
    "role",
    "pool",
    "device",
    "pid",
    "state",
    "seen",
    "batches",
    "images",
    "img/s",
    "model",
)


def _row(v: WorkerView) -> tuple[object, ...]:
    return (
        v.id,
        v.node,
        v.role,
        v.pool,
        v.device or "",
        v.pid,
        v.state,
        f"{v.last_seen_s:.0f}s ago",
        v.batches_done,
        v.images_done,
        v.images_per_s,
        v.model_name or (v.model_sha256 or "")[:12],
    )
