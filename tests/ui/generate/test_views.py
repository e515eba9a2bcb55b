"""The Generate tab's charts, declared on ``Views``: the page opens on them drawn for no run yet."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from kvviz.capture.model_io import model_info
from kvviz.settings import Settings
from kvviz.ui.generate.views import Frame, Views, blank_charts, chart_plots
from kvviz.ui.serving.context import AppContext


def test_blank_charts_draw_every_chart_for_no_run(lm):
    info = model_info(lm)
    charts = blank_charts(Frame(info, "T4", 16e9, 123_456))
    assert set(charts) == {f.name for f in fields(Views) if "draw" in f.metadata} == {"growth", "gauge"}
    growth, gauge = charts["growth"], charts["gauge"]
    assert list(growth.data[0].x or []) == [] and growth.layout.title.text == "KV cache size per step"
    assert "room for 123,456 cached tokens" in gauge.layout.title.text
    bars = dict(zip(gauge.data[0].y, gauge.data[0].text))
    assert bars["KV cache (now)"] == "0 bytes" and bars["T4 memory"] == "16 GB"  # no cache yet, beside the weights


@pytest.fixture(scope="module")
def demo(lm):
    from kvviz.ui.app import build_app

    ctx = AppContext(lm=lm, settings=Settings(precompute=False))
    return ctx, build_app(ctx)


def test_the_tab_s_plots_open_on_their_blank_charts(demo):
    ctx, app = demo
    plots = {
        c.elem_id: c for c in app.blocks.values() if getattr(c, "elem_id", None) in ("cache-growth", "memory-gauge")
    }
    assert set(plots) == {"cache-growth", "memory-gauge"}
    for plot in plots.values():
        assert plot.value and plot.value.get("plot"), f"{plot.elem_id} opens empty"
    assert "room for" in plots["memory-gauge"].value["plot"] and "T4" in plots["memory-gauge"].value["plot"]


def test_chart_plots_without_values_open_empty():
    import gradio as gr

    with gr.Blocks():
        plots = chart_plots()
    assert all(p.value is None for p in plots.values())


def test_the_streamed_token_strips_use_colour_names_gradio_s_page_looks_up(demo):
    """A colour code in a HighlightedText's colour map is turned into its two shades through a canvas by Gradio's
    page on every update of the strip (four canvases per streamed message); a name of its palette is looked up."""
    import gradio

    assets = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    found = {m for f in assets.glob("src-*.js") for m in re.findall(r"\{color:`(\w+)`,primary:", f.read_text())}
    assert {"blue", "orange", "green"} <= found, "Gradio's page no longer names these colours"
    _, app = demo
    strips = {
        c.elem_id: c for c in app.blocks.values() if getattr(c, "elem_id", None) in ("token-stream", "learn-strip")
    }
    assert set(strips) == {"token-stream", "learn-strip"}
    for strip in strips.values():
        assert set(strip.color_map.values()) <= found, (strip.elem_id, strip.color_map)
