"""Presentation mode's server side: charts rescaled by the mode, every tab's step slider reachable by the keys."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from kvviz.figures.scale import PRESENT_SCALE, scale_of, scaled
from kvviz.ui.present import STEP_CLASS, STEP_KEYS, follow, rescale


def payload(fig: go.Figure) -> dict:
    return {"type": "plotly", "plot": fig.to_json()}


def chart() -> go.Figure:
    return go.Figure(go.Bar(x=[1, 2], y=[3, 4]), layout=dict(title="t", height=300))


def test_the_toggle_rescales_every_chart_both_ways():
    on = rescale(True, payload(chart()), None)
    assert scale_of(on[0]) == PRESENT_SCALE and on[0].layout.font.size == pytest.approx(12 * PRESENT_SCALE)
    assert not isinstance(on[1], go.Figure)  # an empty chart is skipped
    off = rescale(False, payload(on[0]))
    assert scale_of(off[0]) == 1.0 and off[0].layout.font.size == pytest.approx(12)
    assert not isinstance(rescale(False, payload(chart()))[0], go.Figure)  # already at its own scale


def test_a_redrawn_chart_is_scaled_once():
    first = follow(payload(chart()))
    assert isinstance(first, go.Figure) and scale_of(first) == PRESENT_SCALE
    assert not isinstance(follow(payload(scaled(chart(), PRESENT_SCALE))), go.Figure)  # no loop
    assert not isinstance(follow(None), go.Figure)


def test_every_tab_with_steps_has_keys_and_a_play_button(lm):
    from kvviz.settings import Settings
    from kvviz.ui.app import build_app
    from kvviz.ui.context import AppContext

    ctx = AppContext(lm=lm, settings=Settings(max_new_tokens=64, max_prompt_tokens=1024, concurrency=1))
    demo = build_app(ctx)
    for key in STEP_KEYS:
        assert STEP_CLASS in (ctx.components[key].elem_classes or []), key
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    assert {"gen-play", "attn-play", "evict-play", "blocks-play", "copy-link", "link-url"} <= ids
