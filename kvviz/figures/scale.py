"""``scaled(fig, factor)``: the same figure with every text larger, for a lecture hall's back row.

Plotly sizes unset fonts from ``layout.font`` (titles ×1.4, axis titles ×1.2), so setting that one size
moves them all; fonts a figure sets itself (the sink map's cell numbers, a legend, a colorbar) are
multiplied one by one. The factor is recorded in ``layout.meta`` so scaling is absolute, not cumulative:
``scaled(scaled(f, 1.6), 1.6)`` equals ``scaled(f, 1.6)`` and ``scaled(…, 1)`` restores the original.

The page applies the same rule in the browser (``kvviz/ui/page/present.py``) from :func:`rule`, so the
factors and the list of fonts live here once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import plotly.graph_objects as go

PRESENT_SCALE = 1.6  # presentation mode: 12 px ticks become ~19 px, 17 px titles ~27 px
BASE_FONT = 12  # plotly's default layout font size
BASE_TITLE = 17  # plotly's default title size (1.4 × the layout font)
BASE_MARGIN = {"l": 80, "r": 80, "t": 100, "b": 80}  # plotly's default margins
TEXT_GAIN = 0.5  # chart heights and titles grow by this share of the text's growth
META_KEY = "kvviz_scale"
# the fonts a figure may set itself, as attribute paths: in the layout, in every x/y axis, in every trace
LAYOUT_FONTS = ("legend.font", "legend.title.font", "hoverlabel.font")
AXIS_FONTS = ("title.font", "tickfont")
TRACE_FONTS = (
    "textfont",
    "insidetextfont",
    "outsidetextfont",
    "colorbar.title.font",
    "colorbar.tickfont",
    "marker.colorbar.title.font",
    "marker.colorbar.tickfont",
)


def rule() -> dict[str, Any]:
    """The scaling rule as plain data (what the browser's copy of :func:`scaled` reads)."""
    return {
        "present": PRESENT_SCALE,
        "font": BASE_FONT,
        "title": BASE_TITLE,
        "margin": BASE_MARGIN,
        "gain": TEXT_GAIN,
        "meta": META_KEY,
        "layout_fonts": LAYOUT_FONTS,
        "axis_fonts": AXIS_FONTS,
        "trace_fonts": TRACE_FONTS,
    }


def scale_of(fig: go.Figure) -> float:
    """The factor ``fig`` was last scaled by (1 for a figure fresh from a figure function)."""
    meta = fig.layout.meta
    if isinstance(meta, dict):
        return float(meta.get(META_KEY, 1.0))
    return 1.0


def _gain(factor: float) -> float:
    """A share of the text's growth: for chart heights (room for the data on one screen) and titles (a long
    title must still fit across a chart in half the page's width)."""
    return 1.0 + TEXT_GAIN * (factor - 1.0)


def _at(obj: Any, path: str) -> Any:
    """``obj.a.b.c`` for ``path`` "a.b.c", or None where a step is not an attribute of ``obj``."""
    for part in path.split("."):
        if obj is None or part not in obj:
            return None
        obj = obj[part]
    return obj


def _fonts(fig: go.Figure) -> Iterator[Any]:
    """Every font object the figure sets or may set explicitly (layout, axes, annotations, traces)."""
    lay = fig.layout
    paths = [(lay, p) for p in LAYOUT_FONTS]
    paths += [(lay[n], p) for n in lay if n.startswith(("xaxis", "yaxis")) and lay[n] is not None for p in AXIS_FONTS]
    paths += [(ann, "font") for ann in lay.annotations]
    paths += [(trace, p) for trace in fig.data for p in TRACE_FONTS]
    for obj, path in paths:
        font = _at(obj, path)
        if font is not None:
            yield font


def scaled(fig: go.Figure, factor: float) -> go.Figure:
    """A copy of ``fig`` with fonts, margins and height at ``factor`` × the figure function's own."""
    if not factor or factor <= 0:
        raise ValueError(f"scale factor must be positive, got {factor!r}")
    out = go.Figure(fig)
    ratio = factor / scale_of(out)
    if abs(ratio - 1.0) < 1e-9:
        return out
    lay = out.layout
    lay.font.size = (lay.font.size or BASE_FONT * scale_of(out)) * ratio
    title = lay.title.font
    title.size = (title.size or BASE_TITLE) * _gain(factor) / _gain(scale_of(out))
    for font in _fonts(out):
        size = font.size
        if isinstance(size, (int, float)):
            font.size = size * ratio
        elif isinstance(size, (list, tuple)):
            font.size = [s * ratio for s in size]
    for side, default in BASE_MARGIN.items():
        current = lay.margin[side]
        if current is not None:
            lay.margin[side] = round(current * ratio)
        elif ratio > 1:
            lay.margin[side] = round(default * ratio)
    if lay.height is not None:
        lay.height = round(lay.height * _gain(factor) / _gain(scale_of(out)))
    meta = dict(lay.meta) if isinstance(lay.meta, dict) else {}
    meta[META_KEY] = factor
    lay.meta = meta
    return out
