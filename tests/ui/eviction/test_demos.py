"""The Eviction tab's demos: planned at start-up, registered for the Learn tab, and filling the tab's own views."""

from __future__ import annotations

import gradio as gr

from kvviz.eviction.demos import NEEDLE_POLICIES
from kvviz.lessons.objectives import NEEDLE
from kvviz.settings import Settings
from kvviz.ui.eviction import tab as tab_eviction
from kvviz.ui.eviction.request import COMPRESS_CONTEXT
from kvviz.ui.serving.context import AppContext

NEEDLE_SHOW_ME_KEY = "eviction.compare_policies"


def test_both_demos_are_planned_and_the_needle_answers_a_show_me_only_when_stored(lm):
    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=64))
    with gr.Blocks():
        tab_eviction.build(ctx)
    assert ctx.store.planned((lm.name, "sinks")) and ctx.planners["eviction.sinks"]({}) == (lm.name, "sinks")
    assert ctx.planners["eviction.needle"]({}) == (lm.name, "needle", True)  # the question votes by default
    assert ctx.planners["eviction.needle"]({"eviction.compress": COMPRESS_CONTEXT}) == (lm.name, "needle", False)
    assert ctx.store.planned((lm.name, "needle", False))
    answer = ctx.answers["eviction.needle"]
    c = ctx.components
    assert answer.inputs[0] is c["eviction.compress"]
    # the form it fills, the run and its five views, then the comparison section's four outputs
    assert answer.outputs[:6] == [
        c[f"eviction.{k}"] for k in ("prompt", "question", "chat", "policy", "mode", "budget")
    ]
    assert len(answer.outputs) == 6 + 4 + 5 + 4
    assert answer.fn(None, "question", False) is None  # not computed yet: the show-me presses the button instead
    # the Learn show-me ticks exactly the policies the demo shows, on the comparison's own checkboxes
    chosen = c[NEEDLE_SHOW_ME_KEY]
    assert isinstance(chosen, gr.CheckboxGroup) and "h2o" in chosen.value  # the tab's default ticks H2O…
    assert NEEDLE.values[NEEDLE_SHOW_ME_KEY] == list(NEEDLE_POLICIES)  # …the show-me unticks what the demo lacks
