"""Sub-tabs: which one holds a component, and Learn's show-mes opening the Blocks section their view is in (Gradio
draws a closed sub-tab's content only when it is opened: a show-me that did not open it would press nothing)."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.lessons.objectives import OBJECTIVES, PITFALLS, SIDE_CHANNEL
from kvviz.lessons.showme import DISK_TIER, KV_BUDGET
from kvviz.settings import Settings
from kvviz.ui.blocks.tab import SECTIONS
from kvviz.ui.page.sections import by_elem_id, opening, section_of
from kvviz.ui.serving.context import AppContext


def test_the_innermost_sub_tab_below_the_top_bar_holds_a_component():
    with gr.Blocks(), gr.Tabs() as top:
        with gr.Tab("Outer", id="outer"):
            plain = gr.Markdown("in the tab itself", elem_id="plain")
            with gr.Tabs(elem_id="bar") as bar:
                with gr.Tab("First", id="first") as tab_1:
                    first = gr.Markdown("a")
                with gr.Tab("Second", id="second") as tab_2, gr.Row():
                    second = gr.Button("b", elem_id="deep")
            with gr.Tabs(), gr.Tab("Unnamed bar"):
                unnamed = gr.Markdown("c")
        assert by_elem_id("deep") is second and by_elem_id("nowhere") is None
    assert section_of(plain, top) is None  # in the top bar's tab: nothing more to open
    assert section_of(first, top) == (bar, tab_1)
    assert section_of(second, top) == (bar, tab_2)
    assert opening([None, plain, second, first], top) == [("bar", "Second")]  # the first found wins
    with pytest.raises(ValueError, match="needs an elem_id"):  # the page finds a bar by its element id
        opening([unnamed], top)


@pytest.fixture(scope="module")
def learn(lm):
    from kvviz.ui.app import build_app

    ctx = AppContext(lm=lm, settings=Settings(precompute=False))
    return ctx, build_app(ctx)


def _page_js(demo, sm) -> str:
    """What the show-me's click runs in the page once its values are set."""
    label = f"▶ Show me: {sm.label}"
    btn = next(b for b in demo.blocks.values() if isinstance(b, gr.Button) and b.value == label)
    (click,) = [f for f in demo.fns.values() if (btn._id, "click") in f.targets]
    (switch,) = [f for f in demo.fns.values() if f.trigger_after == click._id]  # the tab it names opens, in the page
    assert switch.fn is None and "selected" in switch.js
    (then,) = [f for f in demo.fns.values() if f.trigger_after == switch._id]
    return then.js


@pytest.mark.parametrize(
    ("sm", "title"),
    [(DISK_TIER, "The room's cache"), (SIDE_CHANNEL, "The room's cache"), (KV_BUDGET, "Under a KV budget")],
)
def test_a_show_me_opens_the_blocks_section_its_view_is_in(learn, sm, title):
    _ctx, demo = learn
    assert title in SECTIONS
    assert f'const sections = [["blocks-sections", "{title}"]];' in _page_js(demo, sm).replace("\\u00d7", "×")


def test_show_mes_of_views_outside_the_sections_open_no_sub_tab(learn):
    _ctx, demo = learn
    every = [s for o in OBJECTIVES for s in o.show_me] + [p.show_me for p in PITFALLS]
    for sm in every:
        if sm.tab != "tab_blocks":
            assert "const sections = [];" in _page_js(demo, sm), sm.label
