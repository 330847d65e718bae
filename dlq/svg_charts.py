"""Server-side charts as inline SVG: no JavaScript, no CDN, nothing fetched by the browser.

Every piece of text that reaches the markup (title, description, series and
axis labels, colours) goes through ``django.utils.html.escape``, so the result
is safe to mark safe and also well-formed XML.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

# Room around the plot for the y labels (left), half of the last x label (right),
# the legend (top) and the x labels (bottom).
MARGIN_LEFT = 52
MARGIN_RIGHT = 36
MARGIN_TOP = 34
MARGIN_BOTTOM = 30
# Aim for about this many horizontal grid lines; the step is rounded to 1, 2 or 5 × 10^k.
TARGET_Y_TICKS = 4


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[int]
    colour: str  # any CSS colour


def nice_step(max_value: float, *, target_ticks: int = TARGET_Y_TICKS) -> int:
    """A whole-number tick step (1, 2 or 5 × 10^k) giving about ``target_ticks`` intervals up to ``max_value``."""
    raw = max(max_value / target_ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(factor * magnitude for factor in (1, 2, 5, 10) if factor * magnitude >= raw)


def _number(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def line_chart(
    *,
    title: str,
    series: Sequence[Series],
    x_labels: Mapping[int, str],
    description: str = "",
    width: int = 840,
    height: int = 260,
) -> SafeString:
    """An SVG line chart of equally spaced points, one polyline per series, with a legend and labelled axes.

    ``x_labels`` maps point indexes to the labels shown under them (a few, not every point).
    """
    points = max((len(s.values) for s in series), default=0)
    plot_width = width - MARGIN_LEFT - MARGIN_RIGHT
    plot_height = height - MARGIN_TOP - MARGIN_BOTTOM
    bottom = MARGIN_TOP + plot_height
    highest = max((max(s.values, default=0) for s in series), default=0)
    step = nice_step(highest)
    top_value = step * max(1, math.ceil(highest / step))

    def x_at(index: int) -> float:
        return MARGIN_LEFT + (plot_width * index / (points - 1) if points > 1 else plot_width / 2)

    def y_at(value: float) -> float:
        return bottom - plot_height * value / top_value

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="svg-chart" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" font-size="11" fill="currentColor">',
        f"<title>{escape(title)}</title>",
    ]
    if description:
        parts.append(f"<desc>{escape(description)}</desc>")

    # Grid lines and y labels.
    for tick in range(0, top_value + 1, step):
        y = _number(y_at(tick))
        parts.append(
            f'<line x1="{MARGIN_LEFT}" y1="{y}" x2="{width - MARGIN_RIGHT}" y2="{y}" '
            f'stroke="currentColor" stroke-opacity="{0.6 if tick == 0 else 0.15}" />'
        )
        parts.append(f'<text x="{MARGIN_LEFT - 6}" y="{y}" text-anchor="end" dy="0.35em">{escape(tick)}</text>')
    parts.append(
        f'<line x1="{MARGIN_LEFT}" y1="{MARGIN_TOP}" x2="{MARGIN_LEFT}" y2="{bottom}" '
        f'stroke="currentColor" stroke-opacity="0.6" />'
    )

    # X ticks and labels.
    for index, label in sorted(x_labels.items()):
        if not 0 <= index < points:
            continue
        x = _number(x_at(index))
        parts.append(f'<line x1="{x}" y1="{bottom}" x2="{x}" y2="{bottom + 4}" stroke="currentColor" />')
        parts.append(f'<text x="{x}" y="{bottom + 16}" text-anchor="middle">{escape(label)}</text>')

    # The series.
    for one in series:
        coordinates = " ".join(f"{_number(x_at(i))},{_number(y_at(v))}" for i, v in enumerate(one.values))
        parts.append(
            f'<polyline fill="none" stroke="{escape(one.colour)}" stroke-width="1.5" '
            f'stroke-linejoin="round" points="{coordinates}"><title>{escape(one.label)}</title></polyline>'
        )

    # The legend, top left above the plot.
    legend_x = MARGIN_LEFT
    for one in series:
        parts.append(f'<rect x="{legend_x}" y="10" width="12" height="12" fill="{escape(one.colour)}" />')
        parts.append(f'<text x="{legend_x + 17}" y="16" dy="0.35em">{escape(one.label)}</text>')
        # A rough width for the label: the SVG cannot measure text without a browser.
        legend_x += 17 + 7 * len(str(one.label)) + 24

    parts.append("</svg>")
    # Safe: every text and attribute value above is a number or escaped.
    return mark_safe("".join(parts))
