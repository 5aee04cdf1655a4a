"""`detq report`: a self-contained HTML page per job: thumbnails, classes, scores, throughput, failures."""

from __future__ import annotations

import base64
import io
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from html import escape
from pathlib import Path

from sqlalchemy.orm import Session

from db.export_repo import Box, iter_ledger
from db.job_counts_repo import top_reasons
from db.report_repo import (
    failed_images,
    finish_span,
    finish_times,
    job_model_file,
    label_counts,
    score_histogram,
)
from detq.vocabulary import ImageStatus
from producer.annotate import annotated, colour_for
from producer.charts import bar_chart, histogram, line_chart
from producer.progress import time_taken
from producer.status import job_status

THUMBNAILS = 24
# Images tried for them: where a job's files have moved away, the report does not open every one in turn.
THUMBNAIL_TRIES = 4 * THUMBNAILS
THUMBNAIL_SIDE = 320
STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#1c1c1e;max-width:1100px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}
td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}
.grid{display:flex;flex-wrap:wrap;gap:8px}.grid figure{margin:0;width:240px}
.grid img{width:240px;height:auto;border:1px solid #ccc}.grid figcaption{font-size:11px;word-break:break-all}
.facts td:first-child{color:#666}
"""


def throughput_series(
    times: Iterable[tuple[str, datetime]], span: tuple[datetime, datetime] | None, buckets: int = 40
) -> tuple[dict[str, list[float]], float]:
    """Images per second per worker over equal time buckets spanning the job (span: its first and last
    finish time; the times may come in any order); and the bucket length."""
    if span is None:
        return {}, 1.0
    start, end = span
    bucket_s = max((end - start).total_seconds(), 1.0) / buckets
    series: dict[str, list[float]] = defaultdict(lambda: [0.0] * buckets)
    for worker, when in times:
        index = max(0, min(buckets - 1, int((when - start).total_seconds() / bucket_s)))
        series[worker][index] += 1 / bucket_s
    return dict(series), bucket_s


def _thumbnail(path: Path, detections: list[Box]) -> str | None:
    try:
        canvas = annotated(path, detections, THUMBNAIL_SIDE)
    except OSError:
        return None  # the file moved or changed since: the report still renders
    buffer = io.BytesIO()
    canvas.save(buffer, "JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def render_report(session: Session, job_id: int) -> str:
    """The whole page, images inlined, no script and nothing fetched from anywhere."""
    status = job_status(session, job_id)
    classes = label_counts(session, job_id)
    series, bucket_s = throughput_series(finish_times(session, job_id), finish_span(session, job_id))
    figures: list[str] = []
    tried = 0
    for image, detections in iter_ledger(session, job_id):
        if len(figures) >= THUMBNAILS or tried >= THUMBNAIL_TRIES:
            break
        if image.status != ImageStatus.DONE or not detections:
            continue
        tried += 1
        source = _thumbnail(Path(image.path), list(detections))
        if source is not None:
            caption = f"{escape(Path(image.path).name)}: {len(detections)} boxes"
            picture = f'<img src="{source}" alt="{escape(image.path)}">'
            figures.append(f"<figure>{picture}<figcaption>{caption}</figcaption></figure>")
    facts = [
        ("state", status.state.value),
        ("images", f"{status.total}: {status.done} done, {status.failed} failed, {status.rejected} rejected"),
        ("detections", str(status.detections)),
        ("folders", ", ".join(status.roots)),
        ("model", _model_line(session, job_id, status.model_sha256)),
        ("settings", status.settings_line),
        ("elapsed", time_taken(status)),
        ("created", status.created_at),
        ("first claim", status.started_at or "not yet"),
    ]
    if status.closed_reason:
        facts.append(("closed early", status.closed_reason))
    if (unread := status.unreadable_line()) is not None:
        facts.append(("not scanned", unread))
    reasons = top_reasons(session, job_id, limit=10)
    failures = failed_images(session, job_id)
    sections = [
        f"<h1>detq job {status.job_id}</h1>",
        '<table class="facts">'
        + "".join(f"<tr><td>{k}</td><td>{escape(v)}</td></tr>" for k, v in facts)
        + "</table>",
        "<h2>Detections per class</h2>",
        bar_chart(
            [(label, count, colour_for(label_id)) for label_id, label, count in classes], "boxes per class"
        ),
        "<h2>Scores</h2>",
        histogram(score_histogram(session, job_id), "boxes by score"),
        "<h2>Throughput per worker</h2>",
        line_chart(series, bucket_s, "images per second per worker"),
        f"<h2>Images with detections (first {THUMBNAILS})</h2>",
        '<div class="grid">' + "".join(figures) + "</div>" if figures else "<p>none</p>",
        "<h2>Failures</h2>",
        _failures(reasons, failures),
    ]
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>detq job {status.job_id}</title><style>{STYLE}</style></head><body>"
        + "".join(sections)
        + "</body></html>\n"
    )


def _failures(reasons: list[tuple[str, int]], failures: list[tuple[str, str, str]]) -> str:
    if not reasons:
        return "<p>none: every image finished done</p>"
    counted = "".join(f"<tr><td>{n}</td><td>{escape(reason)}</td></tr>" for reason, n in reasons)
    listed = "".join(
        f"<tr><td>{escape(path)}</td><td>{status}</td><td>{escape(reason)}</td></tr>"
        for path, status, reason in failures
    )
    return (
        f"<table><tr><th>images</th><th>reason</th></tr>{counted}</table>"
        f"<h2>Failed and rejected images (first {len(failures)})</h2>"
        f"<table><tr><th>path</th><th>status</th><th>reason</th></tr>{listed}</table>"
    )


def _model_line(session: Session, job_id: int, sha256: str) -> str:
    """The model by its file's name, with its classes where its metadata names them, and its sha256."""
    found = job_model_file(session, job_id)
    if found is None:
        return f"sha256 {sha256[:16]}"
    path, classes = found
    shown = ", ".join(classes[:20]) + (f" and {len(classes) - 20} more" if len(classes) > 20 else "")
    return f"{Path(path).name} ({path}; sha256 {sha256[:16]})" + (f"; classes: {shown}" if classes else "")
