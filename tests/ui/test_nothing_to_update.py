"""A handler with nothing to change answers so that Gradio accepts it.

Gradio 6 reads a dict answer as ``{component: value}`` only when it is not empty: an empty dict from an event with
several outputs fails its output check ("didn't return enough output values"), logged as a server error and, from
a timer, once per tick. Each case here is an event that had nothing to draw and answered ``{}``; the answer goes
through Gradio's own ``postprocess_data``, as a served request does.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvviz.settings import Settings
from kvviz.ui.memory.tab import CUSTOM_GPU
from kvviz.ui.serving.context import AppContext


@pytest.fixture(scope="module")
def app(lm):
    from kvviz.ui.app import build_app

    ctx = AppContext(lm=lm, settings=Settings(precompute=False))
    return ctx, build_app(ctx)


def _event(demo, name: str, n_outputs: int, elem_id: str | None = None):
    found = [
        f
        for f in demo.fns.values()
        if f.name == name
        and len(f.outputs) == n_outputs
        and (elem_id is None or any(getattr(c, "elem_id", None) == elem_id for c in f.inputs))
    ]
    assert len(found) == 1, [(f.name, [getattr(c, "elem_id", None) for c in f.inputs]) for f in found]
    return found[0]


def _served(demo, event, answer) -> list:
    """The answer as Gradio post-processes a served one (raises where Gradio would refuse it)."""
    # in a thread of its own: Playwright may leave an event loop running in the main one
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, demo.postprocess_data(event, answer, None)).result()


def test_the_room_view_tick_with_nothing_new_is_accepted(app):
    _ctx, demo = app
    tick = _event(demo, "tick", 5)
    first = tick.fn(None, None)  # nothing shown yet: the room's cache is drawn
    assert isinstance(first, dict) and len(first) == 5
    _served(demo, tick, first)
    shown = next(v for c, v in first.items() if type(c).__name__ == "State")
    again = tick.fn(shown, None)  # the same signature: nothing new
    _served(demo, tick, again)


def test_a_custom_gpu_keeps_the_typed_numbers(app):
    _ctx, demo = app
    pick = _event(demo, "pick_gpu", 2)
    _served(demo, pick, pick.fn(CUSTOM_GPU))


def test_the_generate_replay_without_a_run_is_accepted(app):
    _ctx, demo = app
    replay = _event(demo, "<lambda>", 2, elem_id="gen-step")
    _served(demo, replay, replay.fn(None, 3))


def test_an_eviction_view_control_without_a_run_is_accepted(app):
    _ctx, demo = app
    redraws = [f for f in demo.fns.values() if f.name == "redraw" and len(f.outputs) == 5]
    assert redraws
    for redraw in redraws:
        _served(demo, redraw, redraw.fn(None, 0, 0, 0))


def test_a_generate_run_that_is_not_a_chat_turn_leaves_the_conversation(app):
    """A lone run (multi-turn off) ends with nothing to add to the conversation: its four views stay."""
    _ctx, demo = app
    after = _event(demo, "after_turn", 4)
    _served(demo, after, after.fn(None, [], False))
