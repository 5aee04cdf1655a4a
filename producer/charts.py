"""Small inline SVG charts for the HTML report: horizontal bars, a histogram, lines over time."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH = 640
LINE_COLOURS = ("#007aff", "#ff9500", "#34c759", "#ff2d55", "#af52de", "#5ac8fa", "#a2845e", "#ffcc00")


def _svg(height: int, body: str, title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{body}</svg>"
    )


def bar_chart(items: Sequence[tuple[str, int, str]], title: str) -> str:
    """One horizontal bar per (label, value, colour), labelled with its value."""
    if not items:
        return "<p>none</p>"
    top = max(value for _, value, _ in items) or 1
    row, label_w, room = 24, 160, WIDTH - 160 - 70
    parts = []
    for i, (label, value, colour) in enumerate(items):
        y = i * row + 4
        length = max(1.0, room * value / top)
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end" font-size="12">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{length:.1f}" height="{row - 8}" fill="{colour}"/>'
            f'<text x="{label_w + length + 6:.1f}" y="{y + 14}" font-size="12">{value}</text>'
        )
    return _svg(len(items) * row + 8, "".join(parts), title)


def histogram(counts: Sequence[int], title: str, low: float = 0.0, high: float = 1.0) -> str:
    """Vertical bars over equal bins of [low, high], with the axis ends labelled."""
    height, base, left = 180, 150, 40
    top = max(counts) if counts and max(counts) > 0 else 1
    step = (WIDTH - left - 10) / max(len(counts), 1)
    parts = [f'<line x1="{left}" y1="{base}" x2="{WIDTH - 10}" y2="{base}" stroke="#888"/>']
    for i, count in enumerate(counts):
        bar = (base - 10) * count / top
        parts.append(
            f'<rect x="{left + i * step + 1:.1f}" y="{base - bar:.1f}" width="{step - 2:.1f}" '
            f'height="{bar:.1f}" fill="#007aff"><title>{count}</title></rect>'
        )
    parts.append(f'<text x="{left}" y="{base + 16}" font-size="11">{low:g}</text>')
    parts.append(f'<text x="{WIDTH - 10}" y="{base + 16}" font-size="11" text-anchor="end">{high:g}</text>')
    parts.append(
        f'<text x="{left - 6}" y="{base - (base - 10) + 10}" font-size="11" text-anchor="end">{top}</text>'
    )
    return _svg(height, "".join(parts), title)


def line_chart(series: dict[str, list[float]], bucket_s: float, title: str) -> str:
    """One line per series over equal time buckets (values per second), a legend of three per row below."""
    if not series:
        return "<p>no images finished yet</p>"
    base, left = 170, 44
    length = max(len(values) for values in series.values())
    top = max((max(values) for values in series.values() if values), default=0.0) or 1.0
    step = (WIDTH - left - 10) / max(length - 1, 1)
    parts = [f'<line x1="{left}" y1="{base}" x2="{WIDTH - 10}" y2="{base}" stroke="#888"/>']
    for index, (name, values) in enumerate(sorted(series.items())):
        colour = LINE_COLOURS[index % len(LINE_COLOURS)]
        points = " ".join(
            f"{left + i * step:.1f},{base - (base - 10) * value / top:.1f}" for i, value in enumerate(values)
        )
        x, y = left + (index % 3) * 200, base + 34 + (index // 3) * 14
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{x}" y="{y}" font-size="11" fill="{colour}">{escape(name)}</text>')
    end = f"{length * bucket_s:.0f} s"
    parts.append(f'<text x="{left + 4}" y="12" font-size="11">{top:.1f} images/s</text>')
    parts.append(f'<text x="{WIDTH - 10}" y="{base + 14}" font-size="11" text-anchor="end">{end}</text>')
    return _svg(base + 44 + 14 * ((len(series) - 1) // 3), "".join(parts), title)
