"""A number typed past a slider's end gets the app's own range message, not Gradio's raw one, and the
Attention tab's layer goes back into range instead of keeping the typed number."""

from __future__ import annotations

import warnings

import gradio as gr
import pytest

from kvviz.capture.loop import capture
from kvviz.settings import Settings
from kvviz.ui import attention as tab_attention
from kvviz.ui.generate import tab as tab_generate
from kvviz.ui.serving.context import AppContext

pytestmark = pytest.mark.slow  # the tabs are built on the real model


def _build(lm, module):
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks() as demo:
        ctx.trace_state = gr.State(None)
        module.build(ctx)
    return ctx, demo


def _handlers(demo, component, output=None):
    """The functions of the events ``component`` triggers (that write ``output``, if given)."""
    out = []
    for fn in demo.fns.values():
        triggered = any(getattr(t[0], "_id", None) == component._id for t in fn.targets)
        reads = any(b is component for b in fn.inputs)
        if (triggered or reads) and (output is None or any(o is output for o in fn.outputs)):
            out.append(fn)
    return out


def test_layer_99_gets_the_range_message_once_and_goes_back_to_the_last_layer(lm):
    ctx, demo = _build(lm, tab_attention)
    layer = ctx.components["attention.layer"]
    assert layer.preprocess(99) == 99  # reaches the handler: Gradio's "Value 99 is greater than …" is not raised
    trace = capture(lm, "Once upon a time", chat=False, max_new_tokens=2)
    writers = _handlers(demo, layer, output=layer)
    assert len(writers) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = writers[0].fn(trace, 99, 0, tab_attention.VIEWS[0], False, 0, 4)
    last = lm.config.num_hidden_layers - 1
    assert out[layer] == last  # the handler answers by component
    assert [str(w.message) for w in caught if f"between 0 and {last}; got 99" in str(w.message)]
    drawn = writers[0].fn(trace, last, 0, tab_attention.VIEWS[0], False, 0, 4)
    titles = [v.layout.title.text for v in drawn.values() if hasattr(v, "layout") and v.layout.title.text]
    assert any(f"Layer {last}" in title for title in titles), titles  # the layer it went back to is drawn


def test_max_new_tokens_100000_on_generate_is_refused_with_a_message(lm):
    ctx, demo = _build(lm, tab_generate)
    max_new = ctx.components["generate.max_new"]
    assert max_new.preprocess(100000) == 100000
    check = next(
        f for f in demo.fns.values() if getattr(f.fn, "__name__", "").startswith("check_") and max_new in f.inputs
    )
    values = {c: c.value for c in check.inputs} | {max_new: 100000}  # the widgets by component, as Gradio sends
    with pytest.raises(gr.Error, match="Max new tokens must be between 1 and 512; got 100,000"):
        check.fn(None, values)
