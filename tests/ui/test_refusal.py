"""A refused request empties the results it would have replaced, so old results never sit under new settings."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.settings import Settings
from kvviz.ui import nocache as tab_nocache
from kvviz.ui import quant as tab_quant
from kvviz.ui.blocks import tab as tab_blocks
from kvviz.ui.eviction import tab as tab_eviction
from kvviz.ui.generate import tab as tab_generate
from kvviz.ui.memory import tab as tab_memory
from kvviz.ui.page.widgets import REFUSED, stale_values
from kvviz.ui.serving.context import AppContext


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings())


def test_stale_values_keep_only_the_note():
    assert stale_values(3) == (REFUSED, None, None) and stale_values(2, 1) == (None, REFUSED)
    assert stale_values(3, 0, [None, None, "blank"]) == (REFUSED, None, "blank")  # a slot's own blank value


def test_a_refused_generate_puts_its_charts_back_to_their_blank_ones(ctx):
    """The next run redraws its charts in place on the page's charts (kvviz/ui/page/plot_redraw.py): a refusal
    that emptied the plots would leave that run without charts until its end."""
    with gr.Blocks() as demo:
        ctx.trace_state = gr.State(None)
        tab_generate.build(ctx)
    found = {c.elem_id: c for c in demo.blocks.values() if getattr(c, "elem_id", None)}
    cleared = next(f for f in demo.fns.values() if f.trigger_only_on_failure and found["cache-growth"] in f.outputs)
    values = dict(zip(cleared.outputs, cleared.fn()))
    assert values[found["gen-status"]] == REFUSED and values[found["token-stream"]] is None
    assert values[found["cache-growth"]].layout.title.text == "KV cache size per step"
    assert "room for" in values[found["memory-gauge"]].layout.title.text


def _cleared_on_failure(demo: gr.Blocks, component) -> bool:
    deps = demo.config["dependencies"]
    return any(d.get("trigger_only_on_failure") and component._id in d["outputs"] for d in deps)


@pytest.mark.parametrize(
    "module,panels",
    [
        (tab_memory, ["memory-summary"]),
        (tab_eviction, ["evict-status", "evict-table"]),
        (tab_quant, ["quant-headline", "quant-gen-summary"]),
        (tab_nocache, ["nocache-summary"]),
        (tab_generate, ["gen-status", "token-stream", "answer", "cache-growth", "memory-gauge", "equivalence"]),
        (tab_blocks, ["blocks-status", "blocks-summary", "blocks-grid", "share-summary", "evblocks-note"]),
    ],
)
def test_each_results_panel_is_cleared_when_its_request_is_refused(ctx, module, panels):
    with gr.Blocks() as demo:
        ctx.trace_state = gr.State(None)  # as the page builds it (the Generate tab writes the session's trace)
        module.build(ctx)
    found = {c.elem_id: c for c in demo.blocks.values() if getattr(c, "elem_id", None)}
    for panel in panels:
        assert _cleared_on_failure(demo, found[panel]), panel
