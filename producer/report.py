"""The HTML report of results: one page per job (`detq report`) or per folder (`detq run`'s report.html,
the latest result of every image across the runs over it).

One pass over the images builds it (`ReportPage.add`, then `ReportPage.write`): the counts, the score
histogram, smoothed throughput, the failures, a few inline thumbnails, and a line of JSON per image spooled
to a file, so memory stays flat in images and in boxes per image. The page lists every image (paged,
filtered by class, score, status and name, in a small inline script; the filter lives in the address's
#fragment, so a view can be linked), each linked to its annotated copy where `--save-images` wrote one,
else to the file, drawn with its boxes. Nothing is fetched from anywhere but the images' own files.
"""

from __future__ import annotations

import base64
import bisect
import io
import json
import os
import shutil
import statistics
import tempfile
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from html import escape
from pathlib import Path
from typing import TextIO

from sqlalchemy.orm import Session

from db.export_repo import iter_ledger
from db.images_repo import DetectionRow
from db.models import Image, as_utc
from db.report_repo import job_model_file
from detq.vocabulary import ImageStatus
from producer.annotate import PALETTE, annotated, colour_for
from producer.charts import bar_chart, histogram, line_chart
from producer.progress import time_taken
from producer.status import job_status

THUMBNAILS = 24
# Images tried for them: where the files have moved away, the report does not open every one in turn.
THUMBNAIL_TRIES = 4 * THUMBNAILS
THUMBNAIL_SIDE = 320
SCORE_BINS = 20
FAILURES_LISTED = 50
REASONS_LISTED = 10
# Boxes drawn over an image in the list (its best by rank); its class summary counts every box.
BOXES_DRAWN = 50
CLASSES_CHARTED = 20  # bars of the classes with most boxes; the rest in one
PAGE_SIZE = 50  # images per page of the list (the script's)
THROUGHPUT_POINTS = 60
MOMENTS_CHARTED = 3  # distinct finish times a throughput chart needs

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#1c1c1e;max-width:1100px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}
td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}
.grid{display:flex;flex-wrap:wrap;gap:8px}.grid figure{margin:0;width:240px}
.grid img{width:240px;height:auto;border:1px solid #ccc}.grid figcaption{font-size:11px;word-break:break-all}
.facts td:first-child{color:#666}
#filters{display:flex;flex-wrap:wrap;gap:12px;align-items:center;font-size:13px;margin:8px 0}
#filters input[type=number]{width:5em}
.thumb{position:relative;width:160px;display:inline-block;line-height:0}
.thumb img{width:160px;height:auto;border:1px solid #ccc}
.thumb span{position:absolute;border:2px solid;box-sizing:border-box}
.done{color:#1d7d32}.failed,.rejected{color:#c0392b}
.pager{font-size:13px;margin:8px 0}.pager button{margin-right:8px}
"""

# The list of every image: reads the JSON data, filters by the #fragment (class, score, status, q, page).
SCRIPT = """
(function () {
  const head = JSON.parse(document.getElementById("report-head").textContent);
  const images = document.getElementById("report-images").textContent.split("\\n")
    .filter((line) => line).map((line) => JSON.parse(line));
  const form = document.getElementById("filters"), body = document.getElementById("image-rows");
  const pager = document.querySelectorAll(".pager"), size = head.page_size;
  function state() {
    const p = new URLSearchParams(location.hash.slice(1));
    return {cls: p.get("class") || "", score: parseFloat(p.get("score") || "0") || 0,
            status: p.get("status") || "", q: (p.get("q") || "").toLowerCase(),
            page: Math.max(1, parseInt(p.get("page") || "1", 10) || 1)};
  }
  function matches(image, s) {
    if (s.status && image.s !== s.status) return false;
    if (s.q && image.n.toLowerCase().indexOf(s.q) < 0) return false;
    if (!s.cls && !s.score) return true;
    return image.c.some((c) => (!s.cls || String(c[0]) === s.cls) && c[2] >= s.score);
  }
  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function thumb(image) {
    const link = el("a", {href: image.a || image.u}), box = el("div", {class: "thumb"});
    box.appendChild(el("img", {src: image.a || image.u, loading: "lazy", alt: image.n}));
    if (!image.a && image.w && image.h) {
      for (const b of image.b) {
        const colour = head.palette[b[0] % head.palette.length];
        box.appendChild(el("span", {title: (head.labels[b[0]] || b[0]) + " " + b[1].toFixed(2),
          style: "left:" + (100 * b[2] / image.w) + "%;top:" + (100 * b[3] / image.h) + "%;width:" +
            (100 * (b[4] - b[2]) / image.w) + "%;height:" + (100 * (b[5] - b[3]) / image.h) +
            "%;border-color:" + colour}));
      }
    }
    link.appendChild(box);
    return link;
  }
  function render() {
    const s = state(), shown = images.filter((image) => matches(image, s));
    const pages = Math.max(1, Math.ceil(shown.length / size)), page = Math.min(s.page, pages);
    form.elements["class"].value = s.cls; form.elements["score"].value = s.score || "";
    form.elements["status"].value = s.status; form.elements["q"].value = s.q;
    body.textContent = "";
    for (const image of shown.slice((page - 1) * size, page * size)) {
      const row = el("tr", {"data-name": image.n});
      const cell = el("td");
      if (image.s === "done") cell.appendChild(thumb(image));
      row.appendChild(cell);
      const name = el("td"); name.appendChild(el("a", {href: image.a || image.u}, image.n));
      row.appendChild(name);
      row.appendChild(el("td", {class: image.s}, image.s + (image.r ? ": " + image.r : "")));
      row.appendChild(el("td", {}, String(image.k)));
      const classes = image.c.slice().sort((a, b) => b[1] - a[1]);
      const said = classes.slice(0, 5).map((c) =>
        (head.labels[c[0]] || c[0]) + " \\u00d7" + c[1] + " (best " + c[2].toFixed(2) + ")").join(", ");
      row.appendChild(el("td", {}, said + (classes.length > 5 ? ", and " + (classes.length - 5) +
        " more classes" : "")));
      body.appendChild(row);
    }
    const matched = shown.length + " of " + images.length + " images match; page " + page + " of " + pages;
    pager.forEach((bar) => {
      bar.querySelector("span").textContent = matched;
      bar.querySelector(".prev").disabled = page <= 1;
      bar.querySelector(".next").disabled = page >= pages;
    });
  }
  function go(changes) {
    const s = state(), p = new URLSearchParams();
    const next = Object.assign({class: s.cls, score: s.score || "", status: s.status, q: s.q, page: s.page},
                               changes);
    for (const key in next) if (next[key] !== "" && next[key] !== 0 && !(key === "page" && next[key] === 1))
      p.set(key, next[key]);
    location.hash = p.toString();
  }
  form.addEventListener("input", () => go({class: form.elements["class"].value,
    score: form.elements["score"].value, status: form.elements["status"].value,
    q: form.elements["q"].value, page: 1}));
  pager.forEach((bar) => {
    bar.querySelector(".prev").addEventListener("click", () => go({page: state().page - 1}));
    bar.querySelector(".next").addEventListener("click", () => go({page: state().page + 1}));
  });
  window.addEventListener("hashchange", render);
  render();
})();
"""


def throughput_series(
    times: Sequence[tuple[str, float]], points: int = THROUGHPUT_POINTS
) -> tuple[dict[str, list[float]], float]:
    """Images per second per worker (and all together, where there are several), smoothed; and the span
    in seconds. times: (worker, when in seconds) of each finished image, in any order.

    At each of `points` moments over the span from the first finish to the last, the rate is the images
    finished within a window around it over the window's length (its start left out: a batch finishing
    at the start of the span was worked on before it). A batch's images finish
    together, so the window covers four of a worker's batches (the median gap between its distinct finish
    times) and a thirtieth of the span at least: a steady run draws a level line, not spikes.
    """
    if len({when for _, when in times}) < MOMENTS_CHARTED:
        return {}, 0.0  # a batch or two: no rate over time to draw
    by_worker: dict[str, list[float]] = defaultdict(list)
    for worker, when in times:
        by_worker[worker].append(when)
    start = min(min(found) for found in by_worker.values())
    end = max(max(found) for found in by_worker.values())
    span = end - start
    gaps = [
        later - earlier
        for found in by_worker.values()
        for earlier, later in zip(sorted(set(found)), sorted(set(found))[1:], strict=False)
    ]
    window = max(4 * statistics.median(gaps) if gaps else 0.0, span / 30, 1e-3)
    lines = dict(by_worker) if len(by_worker) == 1 else {**by_worker, "all workers": [t for _, t in times]}
    series: dict[str, list[float]] = {}
    for name, found in lines.items():
        found.sort()
        values = []
        for i in range(points):
            moment = start + span * i / max(points - 1, 1)
            # Whole windows only: near the ends, the one that touches the end (a clipped one, a batch on
            # its edge, read as a spike)
            low = min(max(start, moment - window / 2), max(start, end - window))
            high = min(end, low + window)
            inside = bisect.bisect_right(found, high) - bisect.bisect_right(found, low)
            values.append(inside / max(high - low, 1e-3))
        series[name] = values
    return series, span


@dataclass
class ReportPage:
    """The report, built in one pass: `add` each image with its boxes (and the path of its annotated copy,
    where one was written), then `write` the page. Links to copies are made relative to `folder`, where
    the page will be written. throughput_job: the job whose finishes the throughput chart draws (a
    folder's report spans runs days apart; its chart is its latest run's)."""

    folder: Path
    roots: Sequence[str]
    throughput_job: int | None = None
    images: int = 0
    detections: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    labels: dict[int, str] = field(default_factory=dict)
    boxes_per_label: Counter[int] = field(default_factory=Counter)
    scores: list[int] = field(default_factory=lambda: [0] * SCORE_BINS)
    finishes: list[tuple[str, float]] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    thumbnails: list[str] = field(default_factory=list)
    thumbnail_tries: int = 0
    job_ids: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._lines = tempfile.SpooledTemporaryFile(max_size=8 << 20, mode="w+", encoding="utf-8")

    def add(self, image: Image, boxes: Sequence[DetectionRow], copy: Path | None = None) -> None:
        """One image's row of the list, and its part of the counts, charts and failures."""
        self.images += 1
        self.statuses[image.status] += 1
        self.job_ids.add(image.job_id)
        name = self._name(image)
        if image.status in (ImageStatus.FAILED, ImageStatus.REJECTED):
            self.reasons[image.reason or "(no reason)"] += 1
            if len(self.failures) < FAILURES_LISTED:
                self.failures.append((image.path, image.status, image.reason or ""))
        if image.job_id == self.throughput_job and image.finished_at is not None and image.worker:
            worker = f"{image.worker} {image.device or ''}".strip()
            self.finishes.append((worker, as_utc(image.finished_at).timestamp()))
        per_class: dict[int, list[float]] = {}
        for box in boxes:
            self.labels.setdefault(box.label_id, box.label)
            self.boxes_per_label[box.label_id] += 1
            self.scores[max(0, min(SCORE_BINS - 1, int(box.score * SCORE_BINS)))] += 1
            count, best = per_class.get(box.label_id, [0, 0.0])
            per_class[box.label_id] = [count + 1, max(best, box.score)]
        self.detections += len(boxes)
        if image.status == ImageStatus.DONE and boxes:
            self._thumbnail(image, boxes)
        row = {
            "n": name,
            "s": image.status,
            "r": image.reason or "",
            "k": len(boxes),
            "c": [[label, int(v[0]), round(v[1], 3)] for label, v in sorted(per_class.items())],
            "b": [
                [b.label_id, round(b.score, 3), round(b.x1), round(b.y1), round(b.x2), round(b.y2)]
                for b in boxes[:BOXES_DRAWN]
            ],
            "w": image.width or 0,
            "h": image.height or 0,
            "a": Path(os.path.relpath(copy, self.folder)).as_posix() if copy is not None else "",
            "u": _file_url(image.path),
        }
        self._lines.write(_script_json(row) + "\n")

    def _name(self, image: Image) -> str:
        """The image as the list shows it: its path under its root (the root's name first, with several)."""
        if not 0 <= image.root_index < len(self.roots):
            return image.path
        root = self.roots[image.root_index]
        relative = os.path.relpath(image.path, root)
        if relative == os.pardir or relative.startswith(os.pardir + os.sep):
            return image.path
        return f"{Path(root).name}/{relative}" if len(self.roots) > 1 else relative

    def _thumbnail(self, image: Image, boxes: Sequence[DetectionRow]) -> None:
        if len(self.thumbnails) >= THUMBNAILS or self.thumbnail_tries >= THUMBNAIL_TRIES:
            return
        self.thumbnail_tries += 1
        try:
            canvas = annotated(Path(image.path), boxes, THUMBNAIL_SIDE)
        except OSError:
            return  # the file moved or changed since: the report still renders
        buffer = io.BytesIO()
        canvas.save(buffer, "JPEG", quality=80)
        source = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
        caption = f"{escape(self._name(image))}: {len(boxes)} boxes"
        picture = f'<img src="{source}" alt="{escape(image.path)}">'
        self.thumbnails.append(f"<figure>{picture}<figcaption>{caption}</figcaption></figure>")

    def counts_line(self) -> str:
        """The images by status and their detections, in a few words."""
        parts = [f"{n} {status}" for status, n in sorted(self.statuses.items(), key=lambda kv: -kv[1])]
        return f"{self.images}: {', '.join(parts) or 'none'}; {self.detections} detections"

    def write(self, out: TextIO, title: str, facts: Sequence[tuple[str, str]]) -> None:
        """The whole page: the facts given, the charts, the thumbnails, the list of every image, the
        failures. Closes the spool."""
        series, span = throughput_series(self.finishes)
        classes = sorted(self.boxes_per_label.items(), key=lambda kv: (-kv[1], kv[0]))
        bars = [(self.labels[i], n, colour_for(i)) for i, n in classes[:CLASSES_CHARTED]]
        if len(classes) > CLASSES_CHARTED:
            rest = classes[CLASSES_CHARTED:]
            bars.append((f"{len(rest)} more classes", sum(n for _, n in rest), "#c7c7cc"))
        out.write(
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{escape(title)}</h1>"
            '<table class="facts">'
            + "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in facts)
            + "</table><h2>Detections per class</h2>"
            + bar_chart(bars, "boxes per class")
            + "<h2>Scores</h2>"
            + histogram(self.scores, "boxes by score")
            + "<h2>Throughput per worker</h2>"
            + line_chart(series, span, "images per second per worker, smoothed")
            + f"<h2>Images with detections (the first {THUMBNAILS})</h2>"
            + (
                '<div class="grid">' + "".join(self.thumbnails) + "</div>"
                if self.thumbnails
                else "<p>none</p>"
            )
            + f"<h2>Every image ({self.images})</h2>"
            + self._filters()
            + '<div class="pager"><button class="prev">previous</button><button class="next">next</button>'
            "<span></span></div>"
            "<table><thead><tr><th></th><th>image</th><th>status</th><th>boxes</th><th>classes</th></tr>"
            '</thead><tbody id="image-rows"></tbody></table>'
            '<div class="pager"><button class="prev">previous</button><button class="next">next</button>'
            "<span></span></div>"
            "<noscript><p>The list needs JavaScript; detections.jsonl holds the same.</p></noscript>"
            "<h2>Failures</h2>" + self._failures()
        )
        head = {
            "labels": {str(k): v for k, v in self.labels.items()},
            "palette": PALETTE,
            "page_size": PAGE_SIZE,
        }
        out.write(f'<script type="application/json" id="report-head">{_script_json(head)}</script>')
        out.write('<script type="application/json" id="report-images">\n')
        self._lines.seek(0)
        shutil.copyfileobj(self._lines, out)
        self._lines.close()
        out.write(f"</script><script>{SCRIPT}</script></body></html>\n")

    def _filters(self) -> str:
        classes = sorted(self.labels.items(), key=lambda kv: kv[1])
        options = "".join(f'<option value="{i}">{escape(name)}</option>' for i, name in classes)
        statuses = "".join(f'<option value="{s}">{s}</option>' for s in sorted(self.statuses))
        return (
            '<form id="filters" onsubmit="return false">'
            f'<label>class <select name="class"><option value="">any</option>{options}</select></label>'
            '<label>score at least <input name="score" type="number" min="0" max="1" step="0.05"></label>'
            f'<label>status <select name="status"><option value="">any</option>{statuses}</select></label>'
            '<label>name <input name="q" type="search" placeholder="part of the path"></label></form>'
        )

    def _failures(self) -> str:
        if not self.reasons:
            return "<p>none: every image finished done</p>"
        counted = "".join(
            f"<tr><td>{n}</td><td>{escape(reason)}</td></tr>"
            for reason, n in self.reasons.most_common(REASONS_LISTED)
        )
        listed = "".join(
            f"<tr><td>{escape(path)}</td><td>{status}</td><td>{escape(reason)}</td></tr>"
            for path, status, reason in self.failures
        )
        return (
            f"<table><tr><th>images</th><th>reason</th></tr>{counted}</table>"
            f"<h2>Failed and rejected images (the first {len(self.failures)})</h2>"
            f"<table><tr><th>path</th><th>status</th><th>reason</th></tr>{listed}</table>"
        )


def _script_json(value: object) -> str:
    """JSON safe inside a <script> element: no '<' to end it early (escaped in strings, where alone it
    can occur)."""
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c")


def _file_url(path: str) -> str:
    try:
        return Path(path).as_uri()
    except ValueError:  # a relative path: only a ledger edited by hand
        return ""


def model_line(session: Session, job_id: int, sha256: str) -> str:
    """The model by its file's name and sha256, with the classes its metadata names (or a word on how to
    name them)."""
    found = job_model_file(session, job_id)
    if found is None:
        return f"sha256 {sha256[:16]}"
    path, classes = found
    if not classes:
        named = "its classes are not named in the file (labels shown as numbers; docs/models.md names them)"
    else:
        named = "classes: " + ", ".join(classes[:20])
        named += f" and {len(classes) - 20} more" if len(classes) > 20 else ""
    return f"{Path(path).name} ({path}; sha256 {sha256[:16]}); {named}"


def _when(iso: str | None) -> str:
    """An ISO time as people read it: 2026-12-07 14:40:12 UTC."""
    if not iso:
        return "not yet"
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def write_job_report(session: Session, job_id: int, out: TextIO, folder: Path) -> ReportPage:
    """`detq report`: the page of one job, every image of it; folder: where the page is written."""
    status = job_status(session, job_id)
    page = ReportPage(folder, status.roots, throughput_job=job_id)
    for image, boxes in iter_ledger(session, job_id):
        page.add(image, boxes)
    facts = [
        ("state", status.state.value),
        ("images", page.counts_line()),
        ("folders", ", ".join(status.roots)),
        ("model", model_line(session, job_id, status.model_sha256)),
        ("settings", status.settings_line),
        ("elapsed", time_taken(status)),
        ("created", _when(status.created_at)),
        ("first claim", _when(status.started_at)),
    ]
    if status.closed_reason:
        facts.append(("closed early", status.closed_reason))
    if (unread := status.unreadable_line()) is not None:
        facts.append(("not scanned", unread))
    page.write(out, f"detq job {job_id}", facts)
    return page


def folder_facts(session: Session, page: ReportPage, job_ids: Sequence[int]) -> list[tuple[str, str]]:
    """The facts of a folder's report (`detq run`): its images as they stand, across its runs (job_ids,
    newest first), the model and settings, and its latest run."""
    if not job_ids:
        return [("images", page.counts_line()), ("folders", ", ".join(page.roots))]
    latest = job_status(session, job_ids[0])
    used = sorted(page.job_ids, reverse=True)
    return [
        ("images", page.counts_line()),
        ("folders", ", ".join(page.roots)),
        ("model", model_line(session, latest.job_id, latest.model_sha256)),
        ("settings", latest.settings_line),
        ("results of", ", ".join(f"job {j}" for j in used) + " (each image's latest)"),
        ("latest run", f"job {latest.job_id}, created {_when(latest.created_at)}: {time_taken(latest)}"),
    ]
