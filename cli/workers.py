"""The worker's commands: run a pool, inspect, pack or check a model. The only commands that load torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.base import (
    EXIT_ERROR,
    DetqCommand,
    DetqGroup,
    as_saved_option,
    examples,
    load_settings,
    with_inference_flags,
)
from cli.output import print_json
from detq.contract import INFERENCE_QUEUES
from detq.errors import DetqError
from detq.speedups import off_by_settings
from detq.vocabulary import ModelFormat, Precision, WorkerPool, choices

if TYPE_CHECKING:
    from worker.check import CheckReport

FORMAT_CHOICE = click.Choice(choices(ModelFormat))


class TorchMissing(DetqError):
    """This install cannot run the worker side (no torch)."""

    exit_code = 3


@click.command(
    cls=DetqCommand,
    epilog=examples(
        "detq worker --pool cpu",
        "detq worker --pool gpu -l DEBUG -n gpu1@%h",
        "detq worker --pool cpu -c 4 -Q cpu --model /models/detector.pt",
    ),
)
@click.option(
    "--pool",
    type=click.Choice(choices(WorkerPool)),
    required=True,
    help="gpu: one process per GPU (queues gpu, any); cpu: one process per core (queues cpu, any).",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    help="Pool processes (default: DETQ_WORKER_CONCURRENCY, else GPUs or cores).",
)
@click.option(
    "-Q",
    "--queues",
    help=f"Comma-separated queues to consume instead of the pool's own ({', '.join(INFERENCE_QUEUES)}).",
)
@click.option("-l", "--loglevel", help="Log level (default: DETQ_LOG_LEVEL).")
@click.option("-n", "--hostname", help="Celery node name (default: <pool>-<pid>@<host>).")
@click.option(
    "--model",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Model file each process preloads (default: DETQ_MODEL).",
)
@click.option("--format", "fmt", type=FORMAT_CHOICE, help="Override the model's output format.")
@click.option("--input-size", help="Override the model's input size: H,W or one number.")
@as_saved_option
def worker(
    pool: str,
    concurrency: int | None,
    queues: str | None,
    loglevel: str | None,
    hostname: str | None,
    model: Path | None,
    fmt: str | None,
    input_size: str | None,
    as_saved: bool,
) -> None:
    """Run a GPU or CPU worker pool.

    Each pool process loads the model once, on its own device (cuda:N or cpu).
    """
    consumed = _parse_queues(queues)
    settings = load_settings()
    _require_torch("detq worker")
    from worker.pool import run_worker  # here, not at the top: only this command needs torch

    updates: dict[str, object] = {}
    if model is not None:
        updates["model"] = model
    if fmt is not None:
        updates["model_format"] = ModelFormat(fmt)
    if input_size is not None:
        updates["input_size"] = input_size
    if as_saved:
        updates["as_saved"] = True
    if updates:
        settings = settings.replace(**updates)
    code = run_worker(
        settings,
        pool=WorkerPool(pool),
        concurrency=concurrency,
        loglevel=loglevel or settings.log_level,
        hostname=hostname,
        queues=consumed,
        announce=lambda line: click.echo(f"detq worker: {line}", err=True),
    )
    raise SystemExit(code)


def _require_torch(command: str) -> None:
    """A clear error on a torch-free install (the slim image, `pip install detq` without the extra)."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is None:
        raise TorchMissing(f"{command} needs torch and torchvision: pip install 'detq[worker]'")


def _parse_queues(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in INFERENCE_QUEUES]
    if unknown or not names:
        raise click.BadParameter(
            f"{text!r}: queues are {', '.join(INFERENCE_QUEUES)}", param_hint="'-Q' / '--queues'"
        )
    return names


@click.group(cls=DetqGroup)
def model() -> None:
    """Inspect a model file, check detq's answers against it, or embed metadata."""


@model.command(
    epilog=examples(
        "detq model inspect /models/detector.pt",
        "detq model inspect yolov8n.torchscript --device cuda:0 --json",
    )
)
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--device", default="cpu", show_default=True, help="Device to load it on: cpu, cuda:0, ...")
@click.option("--format", "fmt", type=FORMAT_CHOICE, help="Override its output format.")
@click.option("--input-size", help="Override its input size: H,W or one number.")
@click.option(
    "--precision",
    type=click.Choice(choices(Precision)),
    default=Precision.FP32.value,
    show_default=True,
    help="Run it as DETQ_PRECISION would.",
)
@click.option("--cpu-optimize", is_flag=True, help="Load it as DETQ_CPU_OPTIMIZE=true would (timed).")
@click.option(
    "--micro-batch",
    type=click.IntRange(1, 256),
    help="Warm it up at this many images, as workers do (default: DETQ_MICRO_BATCH).",
)
@as_saved_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def inspect(
    path: Path,
    device: str,
    fmt: str | None,
    input_size: str | None,
    precision: str,
    cpu_optimize: bool,
    micro_batch: int | None,
    as_saved: bool,
    as_json: bool,
) -> None:
    """What a model file is and whether it runs here.

    Format, classes, input size, saved devices, baked device constants; then a real load and warm-up as
    this machine's workers would load it, with the speed-ups that applied and those turned off.
    """
    _require_torch("detq model inspect")
    from worker.models.inspect import format_report, inspect_model
    from worker.models.metadata import MetaOverrides, parse_input_size

    overrides = MetaOverrides(
        format=ModelFormat(fmt) if fmt else None, input_size=parse_input_size(input_size)
    )
    flags: dict[str, object] = {"cpu_optimize": True} if cpu_optimize else {}
    flags.update({"micro_batch": micro_batch} if micro_batch else {})
    flags.update({"as_saved": True} if as_saved else {})
    settings = load_settings().replace(**flags)  # as the workers of this environment would load it
    report = inspect_model(
        path,
        device=device,
        overrides=overrides,
        precision=Precision(precision),
        cpu_optimize=settings.cpu_optimize,
        micro_batch=settings.micro_batch,
        channels_last=settings.cpu_channels_last,
        sampled_resize=settings.cpu_sampled_resize,
        selected_detections=settings.cpu_selected_detections,
    )
    if report.get("loads_here"):
        report["speedups_off"] = [
            f"{s.name} ({s.variable}={str(s.off).lower()})" for s in off_by_settings(settings)
        ]
    if as_json:
        print_json(report)
    else:
        click.echo(format_report(report))
    if not report.get("loads_here"):
        raise SystemExit(EXIT_ERROR)


@model.command(
    epilog=examples("detq model pack model.pt --meta meta.json -o packed.pt"),
)
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option(
    "--meta",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    required=True,
    help="JSON file with format, classes, input_size, score_threshold, ...",
)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True, help="File to write."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def pack(path: Path, meta: Path, output: Path, as_json: bool) -> None:
    """Embed metadata into a TorchScript copy.

    The JSON file is validated, then stored in the copy as detq.json.
    """
    _require_torch("detq model pack")
    from worker.models.inspect import pack_model

    packed = pack_model(path, meta, output)
    if as_json:
        print_json(packed)
    else:
        click.echo(f"wrote {packed['path']} (sha256 {packed['sha256']})")


@model.command(
    "check",
    epilog=examples(
        "detq model check detector.pt ~/photos",
        "detq model check yolov8n.torchscript /data/cam1 --sample 32 --conf 0.4 --json",
        "DETQ_FAST_DECODE=true detq model check detector.pt ~/photos   # what an opt-in trades",
    ),
)
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False, exists=True), required=False)
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="How many of the folder's images, spread over it (without a folder: made-up photos).",
)
@click.option("--device", default="cpu", show_default=True, help="Device to run it on: cpu, cuda:0, ...")
@click.option(
    "--conf", type=click.FloatRange(0.0, 1.0), help="Score threshold (default: DETQ_SCORE_THRESHOLD)."
)
@click.option("--classes", metavar="NAMES", help="Classes kept: names or label ids (default: DETQ_CLASSES).")
@click.option("--imgsz", metavar="H,W", help="Input size of a fixed-input model (default: DETQ_INPUT_SIZE).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def check(
    path: Path,
    folder: Path | None,
    sample: int,
    device: str,
    conf: float | None,
    classes: str | None,
    imgsz: str | None,
    as_json: bool,
) -> None:
    """Whether detq stores what your model gives, on your own images.

    Runs the model the plain way (the file as saved, Pillow with EXIF orientation, one image a call) and
    as a worker here runs it (its exact rewrites, micro-batches, DETQ_* settings) over a sample of the
    folder, and compares each image's boxes: matched at IoU >= 0.99 with scores within 1e-3. Exit 1 when
    any image differs.
    """
    _require_torch("detq model check")
    from producer.scan import scan_roots
    from worker.check import check_model, made_up_photos, sample_of

    settings = with_inference_flags(load_settings(), conf, classes, imgsz)
    if folder is None:
        with made_up_photos(sample) as photos:
            report = check_model(path, photos, settings, device)
    else:
        found = sorted(Path(f.path) for f in scan_roots([folder.resolve()]) if f.refused is None)
        if not found:
            raise DetqError(f"no image file in {folder}")
        report = check_model(path, sample_of(found, sample), settings, device)
    if as_json:
        print_json(report.as_dict())
    else:
        for line in check_lines(report, folder):
            click.echo(line)
    if not report.agrees:
        raise SystemExit(EXIT_ERROR)


def check_lines(report: CheckReport, folder: Path | None) -> list[str]:
    """The check's report as text: what ran, a line per image, the verdict."""
    where = str(folder) if folder is not None else "made-up photos (give a FOLDER for your own)"
    lines = [
        f"{Path(report.model).name} on {report.device}, {len(report.images)} images of {where}",
        f"settings: {report.settings}"
        + (f"; trading exactness: {', '.join(report.trades)}" if report.trades else ""),
        report.forwards,
        f"{'image':<32} {'size':>10} {'plain':>6} {'detq':>6} {'match':>6} {'score diff':>11}"
        f" {'corner px':>10}",
    ]
    for image in report.images:
        name = Path(image.path).name[:32]
        if image.agreement is None:
            lines.append(f"{name:<32} {image.error}")
            continue
        found = image.agreement
        lines.append(
            f"{name:<32} {f'{image.width}x{image.height}':>10} {found.expected:>6} {found.found:>6}"
            f" {found.matched:>6} {found.max_score_diff:>11.2g} {found.max_corner_diff:>10.3g}"
            + ("" if image.agrees else "  DIFFERS")
        )
    total = report.totals()
    agreeing = sum(1 for image in report.images if image.agrees)
    verdict = (
        f"{agreeing} of {len(report.images)} images agree: recall {total.recall:.3f}, precision"
        f" {total.precision:.3f} at IoU >= 0.99; largest score difference {total.max_score_diff:.2g}"
        f" (tolerance 1e-3), largest corner difference {total.max_corner_diff:.3g} px"
    )
    lines.append(verdict)
    if not report.agrees and report.trades:
        lines.append(
            f"{', '.join(report.trades)} trade exactness for speed: see docs/models.md, or turn them off"
        )
    return lines
