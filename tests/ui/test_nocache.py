"""Cache-vs-no-cache tab handlers, in-process on the real model."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.settings import Settings
from kvviz.ui import nocache as tab
from kvviz.ui.serving.context import AppContext


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings())


@pytest.mark.slow
def test_table_and_measurement(ctx):
    df = tab.table(ctx, "Once upon a time", False, 3)
    assert list(df["Keys and Values computed"]) == ["K/V for tokens 1–4", "K/V for tokens 1–5", "K/V for tokens 1–6"]
    shown = tab.measure(ctx, "Once upon a time", False, 5, progress=lambda *a, **k: None)
    assert tab.REGIME in shown.text
    assert "**Same tokens:** yes" in shown.text
    assert "**8** token-forward passes with the cache vs **30** without" in shown.text
    assert list(shown.numbers["passes without cache"]) == [4, 9, 15, 22, 30]
    assert len(shown.passes_fig.data) == 8 and len(shown.time_fig.data) == 2


@pytest.mark.parametrize("prompt,n,match", [("", 4, "empty"), ("Hi", 0, "N must"), ("Hi", 2.5, "N must")])
def test_bad_input(ctx, prompt, n, match):
    with pytest.raises(gr.Error, match=match):
        tab.measure(ctx, prompt, False, n, progress=lambda *a, **k: None)


def test_show_me_uses_a_long_prompt(lm):
    """Below ~100 prompt tokens per-forward overhead hides the quadratic waste, so the demo must not."""
    from kvviz.capture.model_io import encode_prompt
    from kvviz.lessons.objectives import NOCACHE

    values = NOCACHE.values
    assert len(encode_prompt(lm, values["nocache.prompt"], values["nocache.chat"])) >= 256
    assert "fixed cost" in tab.REGIME and "hundreds of tokens" in tab.REGIME


def test_one_click_fills_the_dramatic_case_and_runs_it(ctx):
    """The article's 'Once upon a time' shows ≈ 2× in time against ≈ 18× in passes; one button loads the
    ~300-token setting (the Learn show-me's, so it is precomputed) and presses Generate."""
    from kvviz.lessons.nocache import DRAMATIC
    from kvviz.lessons.objectives import NOCACHE

    with gr.Blocks() as demo:
        tab.build(ctx)
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    button = by_id["nocache-dramatic"]
    (click,) = [f for f in demo.fns.values() if (button._id, "click") in f.targets]
    assert [o._id for o in click.outputs] == [by_id[k]._id for k in ("nocache-prompt",)] + [
        ctx.components["nocache.chat"]._id,
        by_id["nocache-n"]._id,
    ]
    assert click.fn() == {
        ctx.components["nocache.prompt"]: DRAMATIC.prompt,
        ctx.components["nocache.chat"]: DRAMATIC.chat,
        ctx.components["nocache.new_tokens"]: DRAMATIC.new_tokens,
    }
    assert any("nocache-run" in (f.js or "") for f in demo.fns.values())  # then it presses the run button
    assert NOCACHE.values == {
        "nocache.prompt": DRAMATIC.prompt,
        "nocache.chat": DRAMATIC.chat,
        "nocache.new_tokens": DRAMATIC.new_tokens,
    }
    assert DRAMATIC.label in tab.REGIME
