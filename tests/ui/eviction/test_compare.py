"""The Eviction tab's side-by-side section: laid out, planned when the tab opens, wired to the tab's request."""

from __future__ import annotations

import gradio as gr

from kvviz.settings import Settings
from kvviz.ui.eviction import compare as eviction_compare
from kvviz.ui.eviction import tab as tab_eviction
from kvviz.ui.serving.context import AppContext


def test_the_opening_comparison_is_planned_and_the_button_registered(lm):
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=64))
    with gr.Blocks():
        tab_eviction.build(ctx)
    planned = [e for e in ctx.store.entries() if e.label == "eviction comparison"]
    assert len(planned) == 1
    key = planned[0].key
    assert key[:2] == (lm.name, "compare") and len(key[3]) == 3  # the three policies ticked on opening
    assert isinstance(ctx.components["eviction.compare"], gr.Button)


def test_a_section_laid_out_alone_lists_its_outputs_in_order():
    with gr.Blocks():
        section = eviction_compare.layout()
    assert section.outputs == [section.verdict, section.table, section.bytes_plot, section.kl_plot]
    assert section.chosen.value == ["streaming_llm", "h2o", "snapkv"]
