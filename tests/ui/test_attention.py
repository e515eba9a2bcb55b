"""Attention tab handlers, in-process on a real short run: refresh after a trace, drill-in, validation."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.capture.loop import capture
from kvviz.capture.model_io import model_info
from kvviz.settings import Settings
from kvviz.ui import attention as tab
from kvviz.ui.serving.context import AppContext

pytestmark = pytest.mark.slow  # the handlers redraw a real capture


@pytest.fixture(scope="module")
def trace(lm):
    return capture(lm, "What is the capital of France?", chat=True, max_new_tokens=8)


@pytest.fixture(scope="module")
def info(lm):
    return model_info(lm)


def test_refresh_fits_the_sliders_and_draws_every_view(info, trace):
    r = tab.refresh(info, trace, 20, 4, tab.VIEWS[0], False, 99, 4)
    assert f"{trace.n_prompt} prompt + {trace.n_generated} generated" in r.status and "exact" in r.status
    assert r.step.maximum == len(trace.steps) - 1 and r.step.value == len(trace.steps) - 1  # clamped to the run
    assert r.k.value == 4
    assert "KV head 1" in r.head.group and "Layer 20, query head 4" in r.head.heatmap.layout.title.text
    assert f"step {len(trace.steps) - 1}" in r.step_chart.layout.title.text
    s = r.sinks
    assert s.strip[0] == (trace.tokens[0], "sink")
    assert list(s.table.data.columns)[:2] == ["layer", "q0"] and len(s.table.data) == info.layers
    assert (
        s.sink_map.data[0].z.shape == (info.layers, info.q_heads) and "first 4 tokens" in s.sink_map.layout.title.text
    )
    assert len(s.sink_line.data[0].x) == info.layers and "first 4 tokens" in s.sink_line.layout.title.text
    assert s.norms.data[0].name.startswith("token 0") and len(s.norms.data[0].x) == info.layers


def test_before_any_run_the_tab_says_what_to_do(info, lm):
    assert tab.refresh(info, None, 20, 0, tab.VIEWS[0], False, 0, 4) is None
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks():
        ctx.trace_state = gr.State(None)
        tab.build(ctx)
    [(fn, inputs, outputs)] = ctx.listeners
    shown = fn(None, *[c.value for c in inputs[1:]])
    assert shown == {outputs[0]: tab.EMPTY} and outputs[0].elem_id == "attn-status"  # nothing else is touched


def test_a_click_on_the_sink_table_opens_that_layer_and_head(info, trace):
    layer, head = tab.pick([17, 6])  # row 17, column 6 = query head 5
    assert (layer, head) == (17, 5)
    heat = tab.head_view(info, trace, layer, head, tab.VIEWS[1], True).heatmap
    assert "Layer 17, mean of query heads 3–5 (KV head 1)" in heat.layout.title.text
    assert tab.pick([3, 0]) == (3, None)  # the 'layer' column keeps the head


@pytest.mark.parametrize("args", [(30, 0, 0, 4), (0, 9, 0, 4), (0, 0, 999, 4), (0, 0, 0, 0), (0.5, 0, 0, 4)])
def test_bad_selections_are_readable_errors(trace, args):
    layer, head, step, k = args
    with pytest.raises(gr.Error):
        tab._selection(trace, layer, head, step, k)


def test_the_tab_builds_and_registers_its_inputs(lm):
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks():
        ctx.trace_state = gr.State(None)
        tab.build(ctx)
    for name in ("layer", "head", "view", "log", "step", "k", "sink_table"):
        assert f"attention.{name}" in ctx.components
    assert ctx.components["attention.layer"].elem_id == "attn-layer"
    assert ctx.components["attention.layer"].maximum == 29  # SmolLM2's 30 layers
    [(_, inputs, outputs)] = ctx.listeners  # the refresh after each generation
    assert inputs[0] is ctx.trace_state and len(outputs) == 11
