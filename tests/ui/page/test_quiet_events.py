"""An event that shows no progress names no progress targets, so the page keeps no loading status for its outputs."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.settings import Settings
from kvviz.ui.page import quiet_events
from kvviz.ui.serving.context import AppContext


def _dependency(demo: gr.Blocks, fn_name: str) -> dict:
    return next(d for d in demo.get_config_file()["dependencies"] if d.get("api_name") == fn_name)


def test_hidden_progress_events_get_no_targets_and_shown_progress_keeps_its_own():
    with gr.Blocks() as demo:
        box, out, other = gr.Textbox(), gr.Textbox(), gr.Textbox()
        box.change(lambda x: x, box, out, api_name="hidden", show_progress="hidden")
        box.submit(lambda x: x, box, out, api_name="full")
        box.blur(lambda x: x, box, [out, other], api_name="picked", show_progress="hidden", show_progress_on=other)
    assert quiet_events.install(demo) == 1
    assert _dependency(demo, "hidden")["show_progress_on"] == []  # the page reads [] as "no progress targets"
    assert _dependency(demo, "full")["show_progress_on"] is None  # its outputs, as Gradio shows progress on them
    assert _dependency(demo, "picked")["show_progress_on"] == [other._id]  # a choice made is kept
    assert quiet_events.install(demo) == 0  # once is enough


@pytest.fixture(scope="module")
def demo(lm):
    from kvviz.ui.app import build_app

    return build_app(AppContext(lm=lm, settings=Settings(precompute=False)))


def test_every_event_of_the_app_that_hides_its_progress_has_no_targets(demo):
    deps = demo.get_config_file()["dependencies"]
    hidden = [d for d in deps if d["show_progress"] == "hidden"]
    assert len(hidden) > 50  # the page's loads, timers, tab switches, the Generate run and its check
    assert [d["id"] for d in hidden if d["show_progress_on"] != []] == []


def test_the_events_that_stream_into_the_generate_tab_keep_no_loading_status_for_it(demo):
    status = next(c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "gen-status")
    writers = [f for f in demo.fns.values() if status in f.outputs]
    assert len(writers) >= 2  # the run and the opening example at least
    assert all(f.show_progress == "hidden" and f.show_progress_on == [] for f in writers), [f.name for f in writers]
