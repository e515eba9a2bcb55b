"""Presentation mode's wiring: charts scale in the page by the figure module's rule, with no server round trip;
every tab's step slider is reachable by the keys."""

from __future__ import annotations

import json
import re

import gradio as gr

from kvviz.figures.scale import PRESENT_SCALE, rule
from kvviz.ui.page.present import HEAD, LOAD_JS, SCALE_JS, STEP_CLASS, STEP_KEYS


def test_the_page_scales_by_the_rule_of_kvviz_figures_scale():
    found = re.search(r"const R = (\{.*?\}), CLS", SCALE_JS)
    assert found is not None
    assert json.loads(found.group(1)) == json.loads(json.dumps(rule()))
    assert json.loads(found.group(1))["present"] == PRESENT_SCALE
    assert SCALE_JS in HEAD and SCALE_JS in LOAD_JS  # in the <head>, and on load if a launch left the head out


def test_every_tab_with_steps_has_keys_and_a_play_button(lm):
    from kvviz.settings import Settings
    from kvviz.ui.app import build_app
    from kvviz.ui.serving.context import AppContext

    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=64, max_prompt_tokens=1024, concurrency=1))
    demo = build_app(ctx)
    for key in STEP_KEYS:
        assert STEP_CLASS in (ctx.components[key].elem_classes or []), key
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    plots = {b._id for b in demo.blocks.values() if isinstance(b, gr.Plot)}
    for fn in demo.fns.values():  # a chart redrawn or a mode switched never sends a chart to the server
        if fn.fn is not None:
            assert not any(t[0] in plots and t[1] == "change" for t in fn.targets), (fn.name, fn.targets)
    assert {"gen-play", "attn-play", "evict-play", "blocks-play", "copy-link", "link-url"} <= ids
