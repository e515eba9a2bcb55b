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
    out = tab.refresh(info, trace, 20, 4, tab.VIEWS[0], False, 99, 4)
    assert len(out) == 11
    status, step, k, group, heat, step_fig, strip, sink, line, table, norms = out
    assert f"{trace.n_prompt} prompt + {trace.n_generated} generated" in status and "exact" in status
    assert step.maximum == len(trace.steps) - 1 and step.value == len(trace.steps) - 1  # clamped to the run
    assert k.value == 4
    assert "KV head 1" in group and "Layer 20, query head 4" in heat.layout.title.text
    assert f"step {len(trace.steps) - 1}" in step_fig.layout.title.text
    assert strip[0] == (trace.tokens[0], "sink")
    assert list(table.data.columns)[:2] == ["layer", "q0"] and len(table.data) == info.layers
    assert sink.data[0].z.shape == (info.layers, info.q_heads) and "first 4 tokens" in sink.layout.title.text
    assert len(line.data[0].x) == info.layers and "first 4 tokens" in line.layout.title.text
    assert norms.data[0].name.startswith("token 0") and len(norms.data[0].x) == info.layers


def test_before_any_run_the_tab_says_what_to_do(info):
    out = tab.refresh(info, None, 20, 0, tab.VIEWS[0], False, 0, 4)
    assert out[0] == tab.EMPTY


def test_a_click_on_the_sink_table_opens_that_layer_and_head(info, trace):
    layer, head = tab.pick([17, 6])  # row 17, column 6 = query head 5
    assert (layer, head) == (17, 5)
    _, heat = tab.head_view(info, trace, layer, head, tab.VIEWS[1], True)
    assert "Layer 17, mean of query heads 3–5 (KV head 1)" in heat.layout.title.text
    assert tab.pick([3, 0])[0] == 3  # the 'layer' column keeps the head


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
