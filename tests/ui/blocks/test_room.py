"""The Blocks tab's live prefix-cache section: reads the app's engine, redraws only on change, polls only when shown."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.engine.handle import wait_all
from kvviz.settings import Settings
from kvviz.ui.blocks import room as blocks_room
from kvviz.ui.serving.context import AppContext


def _timers(demo: gr.Blocks) -> list[gr.Timer]:
    return [b for b in demo.blocks.values() if isinstance(b, gr.Timer)]


def test_the_timer_starts_only_when_the_tab_is_opened(lm):
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks() as demo, gr.Tabs() as ctx.tabs:
        with gr.Tab("Other"):
            gr.Markdown("other")
        with gr.Tab("Blocks") as tab:
            blocks_room.build(ctx)
    (timer,) = _timers(demo)
    assert timer.active is False and timer.value == blocks_room.REFRESH_S
    targets = {(d.targets[0][0], d.targets[0][1]) for d in demo.fns.values()}
    assert (tab._id, "select") in targets and (ctx.tabs._id, "select") in targets and (timer._id, "tick") in targets


def _select(label: str) -> gr.SelectData:
    return gr.SelectData(None, {"index": 0, "value": label, "selected": True})


def test_in_a_sub_tab_the_timer_follows_both_bars(lm):
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks() as demo, gr.Tabs() as ctx.tabs:
        with gr.Tab("Other"):
            gr.Markdown("other")
        with gr.Tab("Blocks") as tab, gr.Tabs() as sections:
            with gr.Tab("Paging"):
                gr.Markdown("paging")
            with gr.Tab("The room's cache") as section:
                blocks_room.build(ctx)
    (timer,) = _timers(demo)
    assert timer.active is False
    wired = {}
    for d in demo.fns.values():
        wired.setdefault(d.targets[0], []).append(d)
    (opened,) = wired[(section._id, "select")]  # opening the sub-tab starts it
    assert timer in opened.outputs
    (picked,) = wired[(sections._id, "select")]  # another sub-tab: its name is kept for the tab's next open
    assert [(t.active, pick) for t, pick in (picked.fn(_select(n)) for n in ("The room's cache", "Paging"))] == [
        (True, "The room's cache"),
        (False, "Paging"),
    ]
    # the top bar's one event: opening the Blocks tab draws the section (and starts its timer) only when it is the
    # sub-tab shown (the tab opens on its first sub-tab, so its first open sends the live view alone); picking
    # another tab stops it. The Blocks tab has no select event of its own (one more would be dispatched after
    # the bar's, holding up the tab's example)
    (outer,) = wired[(ctx.tabs._id, "select")]
    assert (tab._id, "select") not in wired
    state = next(c for c in outer.inputs if c is not outer.inputs[0])
    assert state.value == "Paging"
    hidden = outer.fn(None, "Paging", _select("Blocks"), None)
    assert set(hidden) == {timer} and hidden[timer].active is False
    shown = outer.fn(None, "The room's cache", _select("Blocks"), None)
    assert shown[timer].active is True and len(shown) > 1
    away = outer.fn(None, "The room's cache", _select("Other"), None)
    assert set(away) == {timer} and away[timer].active is False


def test_outside_tabs_it_polls_from_the_start(lm):
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks() as demo:
        blocks_room.build(ctx)
    assert _timers(demo)[0].active is True


@pytest.mark.slow
def test_refresh_lists_the_rooms_blocks_and_skips_when_unchanged(lm):
    ctx = AppContext(lm=lm, settings=Settings())
    decode = blocks_room.decoder(ctx)
    room = blocks_room.refresh(ctx, decode, None)
    assert "No blocks yet" in room.summary and "Hit rate 0%" in room.summary and len(room.table) == 0
    sig = room.sig
    assert blocks_room.refresh(ctx, decode, sig) is None, "unchanged: nothing sent"
    h = ctx.engine.submit("What is two plus two?", chat=True, max_new_tokens=2)
    assert wait_all([h], 600)
    room = blocks_room.refresh(ctx, decode, sig)
    summary, tree, table, sources, sig2 = room.summary, room.tree, room.table, room.sources, room.sig
    size = ctx.engine.prefix.block_size
    n = (h.trace.n_prompt - 1) // size
    assert sig2 != sig and len(table) == n and f"**{n} block" in summary
    assert table["text"].iloc[-1].startswith("<|im_start|>system⏎") and set(table["held by"]) == {0}
    assert list(table["tokens"])[-1] == f"0–{size - 1}" and tree.data[0].ids[0] == "root"
    # the request's bar: every prompt token computed (a cold store), none from memory or disk
    assert [t.name for t in sources.data] == ["computed", "memory hit", "disk hit"]
    assert [list(t.y) for t in sources.data] == [[h.trace.n_prompt], [0], [0]]
