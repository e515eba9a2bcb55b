"""A tab's first open: its stored example drawn by name, its progress while it is computed, nothing over a user's
own settings, and nothing twice."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.settings import Settings
from kvviz.ui.page import first_sight
from kvviz.ui.serving.context import AppContext


@pytest.fixture
def tab():
    """A tab with one control, one chart and its example line; an example planned in the store."""
    ctx = AppContext(lm=None, settings=Settings())  # type: ignore[arg-type]  # no model: the store is all it reads
    with gr.Blocks():
        prompt = gr.Textbox("opening prompt")
        chart = gr.Plot()
        line = gr.Markdown()
        opened = gr.State(False)
        timer = gr.Timer(1.0, active=False)
    drawn_from: list = []

    def draw(value, entry, request) -> dict:
        drawn_from.append(value)
        return {chart: f"figure of {value}"}

    entry = ctx.store.plan("key", "the example", lambda report, stop: "result")
    example = first_sight.Example(
        what="the stored example",
        change="type a prompt and press **Run**",
        key=lambda: "key",
        draw=draw,
        outputs=[chart],
        values={prompt: "the example's prompt"},
    )
    fn, inputs, outputs = first_sight.first_open(ctx, example, opened, line, timer)
    return (
        ctx,
        fn,
        entry,
        {"prompt": prompt, "chart": chart, "line": line, "opened": opened, "timer": timer},
        drawn_from,
    )


def test_a_stored_example_is_drawn_by_name_with_its_line(tab):
    ctx, fn, entry, c, drawn_from = tab
    claimed, mine = ctx.store.claim("key")
    ctx.store.run(claimed, "start-up")
    out = fn(None, False, "opening prompt")
    assert out[c["chart"]] == "figure of result" and drawn_from == ["result"]
    assert out[c["prompt"]] == "the example's prompt" and out[c["opened"]] is True
    assert out[c["line"]].startswith("**Example:** the stored example, computed at start-up")
    assert "**Try your own:** type a prompt and press **Run**." in out[c["line"]]
    again = fn(None, True, "the example's prompt")  # opened before: nothing drawn again, the timer stopped
    assert list(again) == [c["timer"]] and again[c["timer"]].active is False
    assert drawn_from == ["result"]


def test_an_example_still_computing_shows_its_progress_and_polls(tab):
    ctx, fn, entry, c, _ = tab
    claimed, _ = ctx.store.claim("key")
    claimed.report(0.4, "12 tokens")
    out = fn(None, False, "opening prompt")
    assert c["chart"] not in out and c["opened"] not in out
    assert "being prepared" in out[c["line"]] and "40 %, 12 tokens" in out[c["line"]]
    assert out[c["timer"]].active is True
    ctx.store.fulfil(claimed, "late result", "start-up", 1.0)
    assert fn(None, False, "opening prompt")[c["chart"]] == "figure of late result"


def test_settings_a_link_changed_are_kept(tab):
    ctx, fn, entry, c, drawn_from = tab
    ctx.store.run(ctx.store.claim("key")[0], "start-up")
    out = fn(None, False, "a prompt from a link")
    assert c["prompt"] not in out and c["chart"] not in out and drawn_from == []
    assert out[c["line"]] == "**Try your own:** type a prompt and press **Run**."


def test_without_start_up_computing_the_line_says_how_to_draw_it(tab):
    ctx, fn, entry, c, _ = tab
    ctx.settings = Settings(precompute=False)
    out = fn(None, False, "opening prompt")
    assert out[c["line"]].startswith("**No ready example yet.** Type a prompt") and out[c["timer"]].active is False
