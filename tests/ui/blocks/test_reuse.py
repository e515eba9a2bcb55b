"""The Blocks tab's reuse sections: the room replayed per page size, and the side-channel timing's button
(stored like every show-me's result)."""

from __future__ import annotations

import gradio as gr

from kvviz.demo_files import DemoFiles
from kvviz.engine.side_channel import Leak, measure
from kvviz.lessons.objectives import SIDE_CHANNEL
from kvviz.settings import Settings
from kvviz.ui.blocks import reuse
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.model_job import MARK


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


def test_the_side_channel_show_me_is_measured_once_stored_and_read_back(lm, monkeypatch, tmp_path):
    measured: list[int] = []

    def counted(lm_, ids, tries, progress=None):
        measured.append(tries)
        return measure(lm_, ids, tries, progress=progress)

    monkeypatch.setattr(reuse, "measure", counted)
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks() as demo:
        reuse.build(ctx)
    key = ctx.planners["blocks.leak_run"]({**SIDE_CHANNEL.values, "blocks.leak_tries": 2})
    assert ctx.store.entry(key).state == "pending"  # planned with the other show-mes, computed at start-up
    (spec,) = {getattr(f.fn, MARK) for f in demo.fns.values() if getattr(f.fn, MARK, None) is not None}
    summary = ctx.components["blocks.leak_summary"]
    chart = spec(ctx, 2, False)[ctx.components["blocks.leak_chart"]]
    again = spec(ctx, 2, False)[summary]  # answered from the store
    assert measured == [2] and "Shared store" in again and "on a first request" in again and chart is not None
    spec(ctx, 2, True)  # "Recompute live" measures again
    assert measured == [2, 2]

    files = DemoFiles(tmp_path, lm.name, "v1", where="test machine")  # the value can go to disk and back
    files.save(key, ctx.store.entry(key).value)
    back, _ = files.load(key)
    assert back == ctx.store.entry(key).value and isinstance(back, Leak)
