"""Small inline SVG charts for the HTML report: horizontal bars, a histogram, lines over time; every axis
with ticks at round numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

WIDTH = 640
LINE_COLOURS = ("#007aff", "#ff9500", "#34c759", "#ff2d55", "#af52de", "#5ac8fa", "#a2845e", "#ffcc00")
AXIS = "#888"
GRID = "#e5e5ea"


def _svg(height: int, body: str, title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{body}</svg>"
    )


def nice_ticks(top: float, most: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top`, at most `most` + 1 of them (steps of 1, 2 or 5 times a
    power of ten): 0, 50, 100, 150 for 137."""
    if top <= 0:
        return [0.0, 1.0]
    rough = top / most
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.2g}"


def _y_axis(ticks: list[float], left: int, base: float, height: float, right: int) -> str:
    """Tick labels on the left and faint grid lines across, for values 0..ticks[-1] over `height` px."""
    parts = []
    for value in ticks:
        y = base - height * value / ticks[-1]
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="{GRID}"/>')
        parts.append(
            f'<text x="{left - 5}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{_label(value)}</text>'
        )
    return "".join(parts)


def _x_tick(x: float, base: float, text: str) -> str:
    return (
        f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}" stroke="{AXIS}"/>'
        f'<text x="{x:.1f}" y="{base + 16}" font-size="11" text-anchor="middle">{escape(text)}</text>'
    )


def bar_chart(items: Sequence[tuple[str, int, str]], title: str) -> str:
    """One horizontal bar per (label, value, colour), labelled with its value, over a ticked value axis."""
    if not items:
        return "<p>none</p>"
    row, label_w, right = 24, 160, WIDTH - 70
    ticks = nice_ticks(max(value for _, value, _ in items))
    room = right - label_w
    base = len(items) * row + 6
    parts = []
    for value in ticks:
        x = label_w + room * value / ticks[-1]
        parts.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{base}" stroke="{GRID}"/>')
        parts.append(_x_tick(x, base, _label(value)))
    for i, (label, value, colour) in enumerate(items):
        y = i * row + 4
        length = max(1.0, room * value / ticks[-1])
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end" font-size="12">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{length:.1f}" height="{row - 8}" fill="{colour}"/>'
            f'<text x="{label_w + length + 6:.1f}" y="{y + 14}" font-size="12">{value}</text>'
        )
    parts.append(f'<line x1="{label_w}" y1="{base}" x2="{right}" y2="{base}" stroke="{AXIS}"/>')
    return _svg(base + 22, "".join(parts), title)


def histogram(counts: Sequence[int], title: str, low: float = 0.0, high: float = 1.0) -> str:
    """Vertical bars over equal bins of [low, high]: the value axis ticked at round counts, the bins'
    axis at every tenth of the range."""
    height, base, left, right = 184, 150.0, 48, WIDTH - 10
    ticks = nice_ticks(max(counts, default=0) or 1, most=4)
    step = (right - left) / max(len(counts), 1)
    parts = [_y_axis(ticks, left, base, base - 10, right)]
    for i, count in enumerate(counts):
        bar = (base - 10) * count / ticks[-1]
        parts.append(
            f'<rect x="{left + i * step + 1:.1f}" y="{base - bar:.1f}" width="{step - 2:.1f}" '
            f'height="{bar:.1f}" fill="#007aff"><title>{count}</title></rect>'
        )
    parts.append(f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="{AXIS}"/>')
    for tenth in range(11):
        parts.append(
            _x_tick(left + (right - left) * tenth / 10, base, f"{low + (high - low) * tenth / 10:g}")
        )
    parts.append(
        f'<text x="{(left + right) / 2}" y="{base + 32}" font-size="11" text-anchor="middle">score</text>'
    )
    return _svg(height, "".join(parts), title)


def line_chart(series: dict[str, list[float]], span_s: float, title: str) -> str:
    """One line per series, its points equally spaced over span_s seconds: the value axis ticked at round
    numbers, the time axis at round seconds; a legend of three per row below."""
    if not series:
        return "<p>too few batches finished to draw a rate over time</p>"
    base, left, right = 170.0, 48, WIDTH - 10
    length = max(len(values) for values in series.values())
    ticks = nice_ticks(max((max(values) for values in series.values() if values), default=0.0) or 1.0)
    step = (right - left) / max(length - 1, 1)
    parts = [_y_axis(ticks, left, base, base - 10, right)]
    parts.append(f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="{AXIS}"/>')
    seconds = nice_ticks(max(span_s, 1.0), most=8)
    for value in seconds:
        if value <= max(span_s, 1.0) + 1e-9:
            parts.append(
                _x_tick(left + (right - left) * value / max(span_s, 1.0), base, f"{_label(value)} s")
            )
    for index, (name, values) in enumerate(sorted(series.items())):
        colour = LINE_COLOURS[index % len(LINE_COLOURS)]
        points = " ".join(
            f"{left + i * step:.1f},{base - (base - 10) * value / ticks[-1]:.1f}"
            for i, value in enumerate(values)
        )
        x, y = left + (index % 3) * 200, base + 36 + (index // 3) * 14
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{x}" y="{y}" font-size="11" fill="{colour}">{escape(name)}</text>')
    parts.append(f'<text x="{left}" y="10" font-size="11">images/s</text>')
    return _svg(int(base) + 46 + 14 * ((len(series) - 1) // 3), "".join(parts), title)
