"""The Blocks tab's reuse sections: the room replayed per page size, and the side-channel timing's button."""

from __future__ import annotations

import gradio as gr

from kvviz.engine.side_channel import Leak
from kvviz.lessons.objectives import SIDE_CHANNEL
from kvviz.settings import Settings
from kvviz.ui.blocks import reuse
from kvviz.ui.serving.context import AppContext


def test_the_sections_draw_the_rooms_replay_and_register_the_show_me_targets(lm):
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks():
        reuse.build(ctx)
    assert {"blocks.leak_tries", "blocks.leak_run"} <= set(ctx.components)
    assert set(SIDE_CHANNEL.values) | {SIDE_CHANNEL.press} <= set(ctx.components)


def test_the_summary_says_how_often_the_second_session_guesses_right():
    times = {
        Leak.key(False, True): [0.05, 0.06],
        Leak.key(False, False): [0.5, 0.6],
        Leak.key(True, True): [0.5, 0.55],
        Leak.key(True, False): [0.52, 0.58],
    }
    text = reuse.leak_summary(Leak(100, 2, times))
    assert "**100%**" in text and "**50%**" in text and "55 ms" in text
