"""Small inline-SVG figures for the pages: no plotting library, no script, no style attribute.

Every figure is `role="img"` with a `<title>` and a `<desc>` (screen readers read them; the
page's Content-Security-Policy allows no inline style, so colours are presentation
attributes). Colours are the pages' palette, each with at least 4.5:1 contrast on white.
Numbers are drawn as given: a figure never computes a figure of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

#: Dark blue, dark red, dark green, dark grey, purple: each >= 4.5:1 on white.
PALETTE = ("#1f4e79", "#a5281b", "#1e6b35", "#4d4d4d", "#6a3d9a")
RAISES, LOWERS, NEUTRAL = "#a5281b", "#1f4e79", "#4d4d4d"
_FONT = 'font-family="system-ui, sans-serif" font-size="11"'


@dataclass
class Series:
    """One line of a chart: points (x, y); `marker` draws each point as a dot."""

    name: str
    points: Sequence[tuple[float, float]]
    color: str = PALETTE[0]
    dashed: bool = False
    marker: bool = False


@dataclass
class Mark:
    """A labelled point on a chart (an operating point, a dropped value)."""

    x: float
    y: float
    label: str
    color: str = PALETTE[1]
    shape: str = "dot"  # dot, cross, triangle


@dataclass
class Axes:
    """Where the data space maps into the figure."""

    x0: float
    x1: float
    y0: float
    y1: float
    width: int = 420
    height: int = 260
    left: int = 46
    right: int = 12
    top: int = 12
    bottom: int = 36
    x_label: str = ""
    y_label: str = ""
    x_ticks: Sequence[float] = field(default_factory=list)
    y_ticks: Sequence[float] = field(default_factory=list)

    def px(self, x: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return self.left + (x - self.x0) / span * (self.width - self.left - self.right)

    def py(self, y: float) -> float:
        span = (self.y1 - self.y0) or 1.0
        return self.height - self.bottom - (y - self.y0) / span * (
            self.height - self.top - self.bottom)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    return [round(start + k * step, 10) for k in range(int((hi - start) / step + 1e-9) + 1)]


def tick_text(v: float) -> str:
    return f"{v:g}" if abs(v) >= 0.01 or v == 0 else f"{v:.1e}"


def figure(ident: str, title: str, desc: str, width: int, height: int,
           body: Sequence[str]) -> Markup:
    """The `<svg>` element around `body`, labelled by its title and description."""
    t, d = f"{ident}-title", f"{ident}-desc"
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" id="{escape(ident)}" '
        f'class="figure" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-labelledby="{t} {d}" {_FONT}>'
        f'<title id="{t}">{escape(title)}</title><desc id="{d}">{escape(desc)}</desc>'
        + "".join(body) + "</svg>")


def _axes(ax: Axes) -> list[str]:
    out = []
    bottom, left = ax.height - ax.bottom, ax.left
    out.append(f'<line x1="{left}" y1="{bottom}" x2="{ax.width - ax.right}" y2="{bottom}" '
               'stroke="#4d4d4d"/>')
    out.append(f'<line x1="{left}" y1="{ax.top}" x2="{left}" y2="{bottom}" stroke="#4d4d4d"/>')
    for x in ax.x_ticks:
        px = ax.px(x)
        out.append(f'<line x1="{px:.1f}" y1="{bottom}" x2="{px:.1f}" y2="{bottom + 4}" '
                   'stroke="#4d4d4d"/>'
                   f'<text x="{px:.1f}" y="{bottom + 15}" text-anchor="middle" '
                   f'fill="#222">{escape(tick_text(x))}</text>')
    for y in ax.y_ticks:
        py = ax.py(y)
        out.append(f'<line x1="{left - 4}" y1="{py:.1f}" x2="{ax.width - ax.right}" '
                   f'y2="{py:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{left - 6}" y="{py + 4:.1f}" text-anchor="end" '
                   f'fill="#222">{escape(tick_text(y))}</text>')
    if ax.x_label:
        out.append(f'<text x="{(left + ax.width - ax.right) / 2:.1f}" y="{ax.height - 4}" '
                   f'text-anchor="middle" fill="#222">{escape(ax.x_label)}</text>')
    if ax.y_label:
        mid = (ax.top + bottom) / 2
        out.append(f'<text x="11" y="{mid:.1f}" text-anchor="middle" fill="#222" '
                   f'transform="rotate(-90 11 {mid:.1f})">{escape(ax.y_label)}</text>')
    return out


def _mark(ax: Axes, m: Mark) -> str:
    x, y = ax.px(m.x), ax.py(m.y)
    tip = f"<title>{escape(m.label)}</title>"
    if m.shape == "cross":
        return (f'<g stroke="{m.color}" stroke-width="2">{tip}<line x1="{x - 4:.1f}" '
                f'y1="{y - 4:.1f}" x2="{x + 4:.1f}" y2="{y + 4:.1f}"/><line x1="{x - 4:.1f}" '
                f'y1="{y + 4:.1f}" x2="{x + 4:.1f}" y2="{y - 4:.1f}"/></g>')
    if m.shape == "triangle":
        return (f'<polygon points="{x:.1f},{y - 5:.1f} {x - 5:.1f},{y + 4:.1f} {x + 5:.1f},'
                f'{y + 4:.1f}" fill="{m.color}">{tip}</polygon>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{m.color}">{tip}</circle>'


def band(ax: Axes, points: Sequence[tuple[float, float, float]], color: str,
         label: str) -> str:
    """A shaded band through (x, low, high) points (an interval around a line)."""
    upper = [f"{ax.px(x):.1f},{ax.py(hi):.1f}" for x, _, hi in points]
    lower = [f"{ax.px(x):.1f},{ax.py(lo):.1f}" for x, lo, _ in reversed(points)]
    return (f'<polygon points="{" ".join(upper + lower)}" fill="{color}" stroke="none">'
            f"<title>{escape(label)}</title></polygon>")


def span(ax: Axes, x0: float, x1: float, color: str, label: str) -> str:
    """A shaded column from x0 to x1 over the whole plot (a stretch of time marked)."""
    left, right = ax.px(x0), ax.px(x1)
    return (f'<rect x="{left:.1f}" y="{ax.top}" width="{max(right - left, 1.0):.1f}" '
            f'height="{ax.height - ax.bottom - ax.top}" fill="{color}">'
            f"<title>{escape(label)}</title></rect>")


def hline(ax: Axes, y: float, color: str, label: str) -> str:
    """A dashed horizontal line across the plot (a threshold)."""
    py = ax.py(y)
    return (f'<line x1="{ax.left}" y1="{py:.1f}" x2="{ax.width - ax.right}" y2="{py:.1f}" '
            f'stroke="{color}" stroke-width="1.5" stroke-dasharray="6 3">'
            f"<title>{escape(label)}</title></line>")


def line_chart(ident: str, title: str, desc: str, ax: Axes, series: Sequence[Series],
               marks: Sequence[Mark] = (), legend: bool = True,
               layers: Sequence[str] = ()) -> Markup:
    """Lines (and dots) on axes, with labelled marks and a legend under the title;
    `layers`: shapes drawn under the lines (bands, spans, thresholds)."""
    body = [*_axes(ax), *layers]
    for s in series:
        pts = [(ax.px(x), ax.py(y)) for x, y in s.points
               if math.isfinite(x) and math.isfinite(y)]
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            body.append(f'<polyline points="{path}" fill="none" stroke="{s.color}" '
                        f'stroke-width="2"{dash}><title>{escape(s.name)}</title></polyline>')
        if s.marker or len(pts) == 1:
            body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{s.color}"/>'
                     for x, y in pts]
    body += [_mark(ax, m) for m in marks]
    if legend:
        x = ax.left + 6
        for k, s in enumerate(series):
            y = ax.top + 10 + 14 * k
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            body.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 16}" y2="{y - 4}" '
                        f'stroke="{s.color}" stroke-width="2"{dash}/>'
                        f'<text x="{x + 20}" y="{y}" fill="#222">{escape(s.name)}</text>')
    return figure(ident, title, desc, ax.width, ax.height, body)


def bar_chart(ident: str, title: str, desc: str, bars: Sequence[tuple[str, float]],
              unit: str = "", width: int = 520, signed: bool = True,
              reference: Sequence[float | None] | None = None) -> Markup:
    """Horizontal bars, one row per label; `signed`: bars grow both ways from zero (raises in
    red, lowers in blue); `reference`: a tick per row (e.g. the training figure)."""
    row, left, right, top = 18, 170, 70, 6
    height = top + row * max(1, len(bars)) + 22
    values = [abs(v) for _, v in bars if math.isfinite(v)]
    refs = [abs(r) for r in reference or [] if r is not None and math.isfinite(r)]
    biggest = max([*values, *refs], default=1.0) or 1.0
    inner = width - left - right
    zero = left + inner / 2 if signed else left
    scale = (inner / 2 if signed else inner) / biggest
    body = [f'<line x1="{zero:.1f}" y1="{top}" x2="{zero:.1f}" y2="{height - 20}" '
            'stroke="#4d4d4d"/>']
    for k, (label, v) in enumerate(bars):
        y = top + k * row
        color = RAISES if v > 0 else LOWERS if v < 0 else NEUTRAL
        if not signed:
            color = PALETTE[0]
        x = zero if v >= 0 else zero + v * scale
        w = abs(v) * scale if math.isfinite(v) else 0
        text = f"{v:+.3f}" if signed else f"{v:.3g}"
        body.append(f'<text x="{left - 6}" y="{y + 12}" text-anchor="end" '
                    f'fill="#222">{escape(label)}</text>'
                    f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 0.5):.1f}" height="{row - 6}" '
                    f'fill="{color}"><title>{escape(label)}: {escape(text)}{escape(unit)}'
                    '</title></rect>'
                    f'<text x="{width - right + 4}" y="{y + 12}" fill="#222">'
                    f'{escape(text)}</text>')
        ref = None if reference is None else reference[k]
        if ref is not None and math.isfinite(ref):
            rx = zero + ref * scale
            body.append(f'<line x1="{rx:.1f}" y1="{y + 1}" x2="{rx:.1f}" y2="{y + row - 1}" '
                        'stroke="#222" stroke-width="2"/>')
    body.append(f'<text x="{zero:.1f}" y="{height - 6}" text-anchor="middle" '
                f'fill="#222">{escape(unit)}</text>')
    return figure(ident, title, desc, width, height, body)


def risk_scale(ident: str, risk: float, low: float | None, high: float | None,
               threshold: float | None, point: str) -> Markup:
    """The risk on a 0-1 scale: its interval as a band, the alert threshold as a tick."""
    ax = Axes(0.0, 1.0, 0.0, 1.0, width=520, height=70, left=16, right=16, top=8, bottom=28,
              x_ticks=[0, 0.25, 0.5, 0.75, 1.0], x_label="risk")
    y = ax.py(0.5)
    body = _axes(ax)
    if low is not None and high is not None:
        body.append(f'<rect x="{ax.px(low):.1f}" y="{y - 8:.1f}" '
                    f'width="{max(ax.px(high) - ax.px(low), 1.5):.1f}" height="16" '
                    f'fill="#c9d9ea" stroke="{PALETTE[0]}"><title>interval {low:.3f} to '
                    f'{high:.3f}</title></rect>')
    if threshold is not None:
        tx = ax.px(threshold)
        body.append(f'<line x1="{tx:.1f}" y1="{ax.top}" x2="{tx:.1f}" y2="{y + 12:.1f}" '
                    f'stroke="{PALETTE[1]}" stroke-width="2" stroke-dasharray="4 2">'
                    f'<title>{escape(point)} threshold {threshold:.3f}</title></line>')
    body.append(f'<circle cx="{ax.px(risk):.1f}" cy="{y:.1f}" r="6" fill="{PALETTE[0]}">'
                f'<title>risk {risk:.3f}</title></circle>')
    desc = (f"Risk {risk:.3f}" + (f", interval {low:.3f} to {high:.3f}" if low is not None
                                  and high is not None else "")
            + (f"; alert threshold {threshold:.3f} ({point})" if threshold is not None else ""))
    return figure(ident, "The risk, its interval and the alert threshold", desc, ax.width,
                  ax.height, body)
