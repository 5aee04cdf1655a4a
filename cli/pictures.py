"""Pictures of a job: annotated copies of its images (`detq render`), an HTML report (`detq report`)."""

from __future__ import annotations

from pathlib import Path

import click

from cli.base import DetqCommand, examples, load_settings
from cli.output import print_json
from db.export_repo import iter_ledger
from db.jobs_repo import get_job
from db.ledger import open_ledger
from detq.vocabulary import ImageStatus
from producer.annotate import annotate
from producer.files import write_atomically
from producer.report import write_job_report
from producer.status import JobNotFound, job_or_latest


@click.command(
    cls=DetqCommand,
    epilog=examples("detq render 42 --out annotated", "detq render 42 --out annotated --limit 100 --json"),
)
@click.argument("job", type=click.IntRange(min=1))
@click.option(
    "--out", type=click.Path(path_type=Path, file_okay=False), required=True, help="Folder to write."
)
@click.option("--limit", type=click.IntRange(min=1), help="At most this many images (default: all done).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def render(job: int, out: Path, limit: int | None, as_json: bool) -> None:
    """Draw a job's detections on copies of its images.

    Boxes with label and score, one colour per class, on JPEG copies named after the images; images
    are read only. Images moved away since the job ran are skipped.
    """
    written = skipped = 0
    with open_ledger(load_settings()) as led, led.reads() as session:
        if get_job(session, job) is None:
            raise JobNotFound(f"no job {job}")
        for image, detections in iter_ledger(session, job):
            if limit is not None and written >= limit:
                break
            if image.status != ImageStatus.DONE:
                continue
            name = f"{image.id}_{Path(image.path).stem}.jpg"
            if annotate(Path(image.path), detections, out / name):
                written += 1
            else:
                skipped += 1
    if as_json:
        print_json({"job_id": job, "out": str(out), "written": written, "skipped": skipped})
    else:
        click.echo(
            f"wrote {written} annotated images to {out}" + (f" ({skipped} missing)" if skipped else "")
        )


@click.command(
    cls=DetqCommand, epilog=examples("detq report 42 -o report.html", "detq report -o latest.html")
)
@click.argument("job", type=click.IntRange(min=1), required=False)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="HTML file to write.",
)
def report(job: int | None, output: Path) -> None:
    """Write a self-contained HTML report of a job (default: the latest).

    Thumbnails with boxes, boxes per class, a score histogram, throughput over time per worker and
    device, and the failures with their reasons; one file, nothing fetched when it opens.
    """
    with open_ledger(load_settings()) as led, led.reads() as session:
        job = job_or_latest(session, job, said=lambda text: click.echo(text, err=True))
        if get_job(session, job) is None:
            raise JobNotFound(f"no job {job}")
        write_atomically(output, lambda out: write_job_report(session, job, out, output.parent))
    click.echo(f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB)")
