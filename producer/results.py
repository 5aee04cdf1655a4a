"""A folder's results as files: JSON lines, COCO results and dataset, annotated images, for `detq run`;
and what the run says at its end, and its exit code, from the folder's state."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sqlalchemy.orm import Session

from db.export_repo import images_with_boxes
from db.history_repo import jobs_over_roots, latest_image_ids
from db.job_counts_repo import RunActivity
from db.models import Image, ModelRecord
from detq.display import visible
from detq.errors import DetqError
from detq.vocabulary import ImageStatus
from producer.annotate import annotate
from producer.coco import CocoDatasetWriter, class_names, coco_categories, coco_result, dumps
from producer.export import image_record
from producer.files import write_atomically
from producer.progress import EXIT_FINISHED_WITH_FAILURES, format_duration
from producer.report import ReportPage, folder_facts

# Distinct reasons tallied for the folder's summary: past this many, further new ones are not counted.
MAX_REASONS_TALLIED = 10_000


@dataclass(frozen=True)
class WrittenResults:
    """What `write_results` wrote: the folder's images as they stand, by status, and their detections."""

    images: int
    detections: int
    annotated: int
    files: list[str]
    not_annotated: int = 0  # with save_images: done images that could not be read to draw on
    statuses: dict[str, int] = field(default_factory=dict)  # images by the status of their latest row
    reasons: list[tuple[str, int]] = field(default_factory=list)  # the commonest, of failed and rejected

    def count(self, status: ImageStatus) -> int:
        """The folder's images whose latest row has this status."""
        return self.statuses.get(status.value, 0)


TROUBLED = (ImageStatus.FAILED.value, ImageStatus.REJECTED.value)


def write_results(
    session: Session,
    results: tuple[ModelRecord, str],
    roots: Sequence[str],
    out_dir: Path,
    *,
    only: Sequence[str] | None = None,
    save_images: bool,
    report: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> WrittenResults:
    """Every image of these roots with its latest outcome under this model at these settings (results: the
    model and the key of its inference settings), across the runs over them; progress(done, total) after
    each image (drawing its copy is the slow part). only: these paths of the roots alone (`detq run` of
    files). With report, report.html too: the folder's page
    (producer.report), built in the same pass.

    One pass over the images, a chunk at a time, writes the three files together (the dataset's
    annotations spooled, then appended after its images), so memory holds a chunk whatever the folder's
    size (a folder of 100,000 images of 10 boxes took 1.6 GB when they were all loaded first).
    """
    model, settings_key = results
    jobs = jobs_over_roots(session, model.id, settings_key, roots)
    job_ids = [job.id for job in jobs]
    image_ids = latest_image_ids(session, job_ids, only)
    info: dict[str, object] = {"description": f"detq results of {', '.join(roots)}"}
    if jobs and jobs[0].settings is not None:
        info["settings"] = jobs[0].settings  # what these results are made with (detq.inference_settings)
    categories = coco_categories(class_names(session, model, job_ids))
    out_dir.mkdir(parents=True, exist_ok=True)
    copies = AnnotatedCopies(out_dir / "images", roots)
    page = ReportPage(out_dir, roots, throughput_job=job_ids[0] if job_ids else None) if report else None
    counts = {"images": 0, "detections": 0, "annotated": 0, "not_annotated": 0}
    statuses: Counter[str] = Counter()
    reasons: Counter[str] = Counter()

    def write_all(lines: TextIO, results: TextIO, dataset_out: TextIO) -> None:
        with tempfile.TemporaryFile("w+", encoding="utf-8", dir=out_dir) as spool:
            dataset = CocoDatasetWriter(dataset_out, info, categories, spool)
            results.write("[")
            for image, boxes in images_with_boxes(session, image_ids):
                lines.write(dumps(image_record(image, boxes)) + "\n")
                counts["images"] += 1
                if progress is not None:
                    progress(counts["images"], len(image_ids))
                statuses[image.status] += 1
                if image.status in TROUBLED and (
                    image.reason in reasons or len(reasons) < MAX_REASONS_TALLIED
                ):
                    reasons[image.reason or "(no reason)"] += 1
                copy = None
                if image.status == ImageStatus.DONE:
                    dataset.add_image(image)
                    dataset.add_boxes(image.id, boxes)
                    for box in boxes:
                        results.write(
                            (", " if counts["detections"] else "") + dumps(coco_result(image.id, box))
                        )
                        counts["detections"] += 1
                    # An image moved or unreadable since it ran is counted, not drawn: the results hold it
                    if save_images and annotate(Path(image.path), boxes, copy := copies.path_of(image)):
                        counts["annotated"] += 1
                    elif save_images:
                        copy = None
                        counts["not_annotated"] += 1
                if page is not None:
                    page.add(image, boxes, copy)
            results.write("]\n")
            dataset.close()

    write_atomically(
        out_dir / "detections.jsonl",
        lambda lines: write_atomically(
            out_dir / "coco_results.json",
            lambda results: write_atomically(
                out_dir / "coco_dataset.json", lambda dataset: write_all(lines, results, dataset)
            ),
        ),
    )
    files = ["detections.jsonl", "coco_results.json", "coco_dataset.json"]
    if save_images:
        files.append("images/")
    if page is not None:
        facts = folder_facts(session, page, job_ids)
        title = f"detq results of {', '.join(roots)}"
        write_atomically(out_dir / "report.html", lambda handle: page.write(handle, title, facts))
    if (out_dir / "report.html").exists():
        files.append("report.html")
    return WrittenResults(
        images=counts["images"],
        detections=counts["detections"],
        annotated=counts["annotated"],
        files=files,
        not_annotated=counts["not_annotated"],
        statuses=dict(statuses),
        reasons=reasons.most_common(5),
    )


# Free space --out needs before a run starts: the workers' log goes there, and it is their start's signal.
OUT_FREE_BYTES = 8 << 20


def check_out_folder(out_dir: Path) -> None:
    """Make the --out folder, or say in one line why it cannot be written (or its disk is full), before
    anything starts."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".detq-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        free = shutil.disk_usage(out_dir).free
    except OSError as exc:
        raise DetqError(f"cannot write to --out {out_dir}: {exc.strerror or exc}") from exc
    if free < OUT_FREE_BYTES:
        raise DetqError(
            f"--out {out_dir} is on a disk with {free / 2**20:.1f} MiB free (the results and the workers' log"
            f" need at least {OUT_FREE_BYTES >> 20} MiB): free some space or choose another --out"
        )


def check_copies_folder(out_dir: Path, roots: Sequence[Path]) -> None:
    """Refuse an --out whose images/ folder overlaps a folder being run: the copies keep the folders'
    layout, so they could land on the inputs themselves, and a later scan would take them for images."""
    copies = (out_dir / "images").expanduser().resolve()
    for root in roots:
        folder = root.expanduser().resolve()
        if copies.is_relative_to(folder) or folder.is_relative_to(copies):
            raise DetqError(
                f"--out {out_dir} would put annotated copies in {copies}, which overlaps {folder} (one of the"
                " folders being run): choose an --out outside it"
            )


class AnnotatedCopies:
    """Where each image's annotated copy goes: its path under its root, kept as it is, under the folder
    (a.jpg, a.png, sub/x.jpg and sub__x.jpg stay four files), in the original's format. With several
    roots, each root's copies lie under a folder named after it (its name, numbered where two roots share
    one)."""

    def __init__(self, folder: Path, roots: Sequence[str]) -> None:
        self.folder = folder
        self.roots = list(roots)
        names = [Path(root).name or "root" for root in self.roots]
        self.prefixes = (
            [""]
            if len(self.roots) <= 1
            else [name if names.count(name) == 1 else f"{name}-{i + 1}" for i, name in enumerate(names)]
        )

    def path_of(self, image: Image) -> Path:
        """The copy's path: a file that no other image of these roots maps to."""
        inside = 0 <= image.root_index < len(self.roots)
        root = self.roots[image.root_index] if inside else ""
        relative = os.path.relpath(image.path, root) if root else os.path.basename(image.path)
        if relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
            relative = os.path.basename(image.path)  # not under its root: only a ledger edited by hand
        prefix = self.prefixes[image.root_index] if inside and len(self.prefixes) > 1 else ""
        return self.folder / prefix / relative


def run_summary_lines(activity: RunActivity, written: WrittenResults, out_dir: Path) -> list[str]:
    """detq run's closing words, from the ledger: what this run did (its images/s over the time images
    were being processed), then what the folder holds, its files, and the commonest reasons of its
    failures."""
    if activity.finished:
        seconds = activity.processing_s
        took = ""
        if seconds is not None and seconds > 0:
            took = f" in {format_duration(seconds, tenths=True)} ({activity.finished / seconds:.1f} images/s)"
        did = f"this run: {activity.done} done, {activity.failed} failed, {activity.rejected} rejected{took}"
    else:
        did = "this run: no image to process"
    parts = [
        f"{written.count(s)} {s.value}" for s in FOLDER_STATUSES if written.count(s) or s is ImageStatus.DONE
    ]
    lines = [
        did,
        f"the folder: {written.images} images: {', '.join(parts)}; {written.detections} detections",
        f"results: {out_dir}/ ({', '.join(written.files)})",
    ]
    lines += [f"  {count:>6} x {reason}" for reason, count in written.reasons]
    return [visible(line) for line in lines]  # reasons and folders name files, which may hold escapes


FOLDER_STATUSES = (
    ImageStatus.DONE,
    ImageStatus.FAILED,
    ImageStatus.REJECTED,
    ImageStatus.PENDING,
    ImageStatus.CANCELLED,
)


def folder_exit_code(written: WrittenResults) -> int:
    """EXIT_FINISHED_WITH_FAILURES while any of the folder's images is failed, rejected or cancelled (what
    every rerun says until they are run again or the files change), else 0."""
    troubled = sum(
        written.count(s) for s in (ImageStatus.FAILED, ImageStatus.REJECTED, ImageStatus.CANCELLED)
    )
    return EXIT_FINISHED_WITH_FAILURES if troubled else 0
