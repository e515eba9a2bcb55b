"""What the Generate tab renders from a streamed run's snapshots: prefill, steps, the check, the end."""

from __future__ import annotations

import copy
import json
from dataclasses import fields

import gradio as gr
import pytest

import kvviz.ui.generate.stream as gs
from kvviz.capture.loop import capture
from kvviz.capture.model_io import Progress
from kvviz.ui.generate.views import Frame, Views
from kvviz.ui.serving.streaming import Snapshot


@pytest.fixture(scope="module")
def views():
    """The tab's views, one plain component per field (none rendered): a run's updates are keyed by them."""
    return Views(inputs={}, **{f.name: gr.Markdown(elem_id=f"v-{f.name}") for f in fields(Views) if f.name != "inputs"})


@pytest.fixture(scope="module")
def trace(lm):
    return capture(lm, "Once upon a time", chat=False, max_new_tokens=6, verify=True)


@pytest.fixture
def live(trace, views):
    exported = []

    def export(t):
        exported.append(t)
        return "trace.npz", "steps.csv"

    frame = Frame(trace.model, "T4", 16e9, 123_456)
    run = gs.LiveRun(views, frame, trace.tokens[: trace.n_prompt], export)
    run.exported = exported
    return run


def running(trace, n_steps: int, progress=None) -> Snapshot:
    """A snapshot taken while the worker had yielded ``n_steps`` steps (the trace object is further on)."""
    return Snapshot(trace, (n_steps, "partial text"), progress, n_steps, False)


def test_a_snapshot_shows_the_trace_as_it_was_when_yielded(trace):
    cut = gs.view(running(trace, 2))
    assert len(cut.steps) == 2 and cut.n_generated == 2 and cut.tokens == trace.tokens[: trace.n_prompt + 2]
    assert cut.text == "partial text"
    assert len(trace.steps) == 6, "the worker's trace itself is left alone"


def test_a_long_prefill_says_how_far_it_got(live, views):
    out = live.outputs(Snapshot(None, None, Progress("prefill", 2048, 6371), 0, False))
    assert out[views.status].startswith("Prefill: 2,048 / 6,371 prompt tokens")
    assert len(out[views.tokens]) == 4 and {label for _, label in out[views.tokens]} == {"prompt"}  # at once
    assert views.trace not in out and views.growth not in out and out[views.answer] == ""


def test_the_check_says_it_is_running(live, trace, views):
    out = live.outputs(running(trace, 6, Progress("verify", 0, 1)))
    assert out[views.status].startswith("Checking: the whole sequence again from scratch, without the cache")
    assert out[views.status].endswith("(6 tokens generated)")


def test_charts_are_drawn_less_often_than_the_status(live, trace, views, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(gs.time, "monotonic", lambda: clock[0])
    first = live.outputs(running(trace, 2))
    assert first[views.status].startswith("Generating: 2 tokens") and len(first[views.tokens]) == trace.n_prompt + 2
    # the run's first charts too are redrawn in place, on the charts the page opened on (a gr.Plot given a value
    # builds its chart anew): every chart, by its page id, in the hidden box, no new value for the plots
    assert not set(views.charts()) & set(first)
    drawn = {c["id"]: json.loads(c["figure"]) for c in json.loads(first[views.redraw])}
    assert set(drawn) == {plot.elem_id for plot in views.charts()}
    assert len(drawn[views.growth.elem_id]["data"][0]["x"]) == 2
    clock[0] += gs.FIGURES_S / 2
    soon = live.outputs(running(trace, 3))
    assert soon[views.status].startswith("Generating: 3 tokens") and not set(views.charts()) & set(soon)
    assert soon[views.answer] and views.tokens not in soon, "the text with the status, the chips with the charts"
    assert views.waste not in soon and views.check not in soon  # long paragraphs go with the charts
    assert "with the cache **5**" in first[views.waste] and first[views.check] == gs.PENDING_CHECK
    clock[0] += gs.FIGURES_S
    later = live.outputs(running(trace, 4))
    assert views.trace not in later and live.exported == []
    assert not set(views.charts()) & set(later)
    drawn = {c["id"]: json.loads(c["figure"]) for c in json.loads(later[views.redraw])}
    assert set(drawn) == {plot.elem_id for plot in views.charts()}
    assert len(drawn[views.growth.elem_id]["data"][0]["x"]) == 4
    assert len(later[views.tokens]) == trace.n_prompt + 4
    assert "room for 123,456 cached tokens" in drawn[views.gauge.elem_id]["layout"]["title"]["text"]
    assert first[views.npz] is None and views.npz not in later, "the previous run's files cleared once, at the start"


def test_a_stopped_run_ends_with_its_charts_in_the_plots(live, trace, views, monkeypatch):
    """Stopped within FIGURES_S of the last redraw: the plots still get the run's last charts (their value, not
    only what the page redrew in place)."""
    monkeypatch.setattr(gs.time, "monotonic", lambda: 100.0)
    live.outputs(running(trace, 2))
    stopped = copy.copy(trace)
    stopped.colsum = None  # cut off before its end: no arrays
    out = live.outputs(Snapshot(stopped, (3, "partial"), None, 3, True))
    assert set(views.charts()) <= set(out) and views.redraw not in out and views.trace not in out


def test_the_end_sends_everything_once_and_the_files_after_it(live, trace, views):
    out = live.outputs(Snapshot(trace, (6, trace.text), Progress("verify", 1, 2), 7, True))
    assert out[views.trace] is trace and out[views.status].startswith("Done: 6 tokens")
    assert "stop: max_new_tokens" in out[views.status] and "equals" in out[views.check]
    assert set(views.charts()) <= set(out) and views.redraw not in out  # the last through the plots: their value
    # "Done" does not wait for the export: the files are written for an update of their own
    assert live.exported == []
    assert live.files(trace) == {views.npz: "trace.npz", views.csv: "steps.csv"} and live.exported == [trace]


def test_the_replay_slider_is_set_only_when_the_run_is_done(trace):
    assert gs.replay_range(running(trace, 3)) is None
    assert gs.replay_range(Snapshot(None, None, None, 0, True)) is None
    done = gs.replay_range(Snapshot(trace, (6, trace.text), None, 7, True))
    assert done.maximum == len(trace.steps) - 1 and done.value == len(trace.steps) - 1
