"""The page's opening asks the server little, and nothing the server sets is drawn twice.

Every ``load`` event is a request of its own as the page opens, beside the first screen's example, and a value
function on a component is one too; every ``change`` listener on a control the server also sets runs again after
the answer that set it, sending the charts it drew a second time (the Blocks tab's example drew its grid twice,
the first screen its token strip and cache growth).
"""

from __future__ import annotations

import pytest

from kvviz.settings import Settings
from kvviz.ui.serving.context import AppContext

MOST_LOAD_EVENTS = 6  # links, presentation mode, the opening example, Learn's lines, and a little room


@pytest.fixture(scope="module")
def app(lm):
    from kvviz.ui.app import build_app

    ctx = AppContext(lm=lm, settings=Settings(precompute=False))
    return ctx, build_app(ctx)


def _on(demo, event: str) -> list:
    return [f for f in demo.fns.values() if any(name == event for _, name in f.targets)]


def test_a_handful_of_load_events_and_learn_s_lines_written_by_one(app):
    ctx, demo = app
    loads = _on(demo, "load")
    assert len(loads) <= MOST_LOAD_EVENTS, [f.name for f in loads]
    notes = {
        id(c)
        for c in demo.blocks.values()
        if str(getattr(c, "elem_id", "")).startswith(("showme-", "pitfall-")) and c.elem_id.endswith("-note")
    }
    writes = [len(notes & set(map(id, f.outputs))) for f in loads]
    # the lines read from stored results (most of them: a line with fixed numbers is written once, at build)
    assert sorted(writes)[-1] >= 8 and sorted(writes)[-2] == 0, writes


@pytest.mark.parametrize("key", ["generate.step", "blocks.step", "blocks.block_size"])
def test_a_control_the_server_sets_redraws_only_on_the_visitor_s_move(app, key):
    ctx, demo = app
    control = ctx.components[key]
    changed = [f for f in demo.fns.values() if (control._id, "change") in [tuple(t) for t in f.targets]]
    moved = [f for f in demo.fns.values() if (control._id, "input") in [tuple(t) for t in f.targets]]
    assert changed == [] and len(moved) == 1, ([f.name for f in changed], [f.name for f in moved])
    # ``input`` defaults to "once" (a move while one draws is dropped, the chart left a step behind): the last is kept
    assert moved[0].trigger_mode == "always_last"


def test_no_server_event_reads_or_writes_a_tab_bar_or_a_tab(app):
    """A tab bar or tab among a server event's inputs or outputs stays in the page's loading-status table for
    good, and Gradio's page then reads every drawn component's value under it (the whole page, for the top bar)
    twice per server event: each tab opened made every later click slower (Blocks' example 2.2 s after its click
    against 1.2 s). Tabs switch in the page (:mod:`kvviz.ui.page.tab_switch`), not from the server."""
    import gradio as gr

    _, demo = app
    bad = [
        (f.name, type(c).__name__, getattr(c, "label", None))
        for f in demo.fns.values()
        if f.fn is not None
        for c in [*f.inputs, *f.outputs]
        if isinstance(c, (gr.Tabs, gr.Tab))
    ]
    assert bad == [], bad


def test_a_generate_run_streams_without_gradio_s_progress_timer(app):
    """The run's status line says where it is (its place in the room, the prefill, the tokens, the check); Gradio's
    progress tracker beside it redrew the page every frame for the whole run, CPU a browser on the server's own
    cores took from the model (200 tokens in 10.75 s against 10.28 s, ``bench/page_speed.py``'s page run, interleaved)."""
    _, demo = app
    status = next(c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "gen-status")
    runs = [f for f in demo.fns.values() if f.fn is not None and status in f.outputs and len(f.outputs) > 5]
    assert runs and all(f.show_progress == "hidden" for f in runs), [(f.name, f.show_progress) for f in runs]


def test_the_opening_example_never_writes_the_form_a_visitor_may_be_typing_in(app):
    """The Generate tab opens on its example's form in the page itself; the page-load answer that draws the example
    arrives later (seconds on a busy server), and when it set the form it replaced a prompt typed meanwhile
    (``bench/page_speed.py`` ran "What is the capital of France?" instead of its own prompt)."""
    from kvviz.lessons.objectives import EQUIVALENCE

    ctx, demo = app
    form = {name: ctx.components[f"generate.{name}"] for name in ("prompt", "chat", "max_new")}
    status = next(c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "gen-status")
    opening = [f for f in _on(demo, "load") if status in f.outputs]
    assert len(opening) == 1, [f.name for f in opening]
    assert not set(map(id, form.values())) & set(map(id, opening[0].outputs))
    opens_on = {name: c.value for name, c in form.items()}
    assert opens_on == {name: EQUIVALENCE.values[f"generate.{name}"] for name in form}, opens_on
