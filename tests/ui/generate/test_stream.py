"""What the Generate tab renders from a streamed run's snapshots: prefill, steps, the check, the end."""

from __future__ import annotations

import gradio as gr
import pytest

import kvviz.ui.generate.stream as gs
from kvviz.capture.loop import capture
from kvviz.capture.model_io import Progress
from kvviz.ui.serving.streaming import Snapshot


def skipped(value) -> bool:
    return isinstance(value, dict) and value == gr.skip()


@pytest.fixture(scope="module")
def trace(lm):
    return capture(lm, "Once upon a time", chat=False, max_new_tokens=6, verify=True)


@pytest.fixture
def live(trace):
    exported = []

    def export(t):
        exported.append(t)
        return "trace.npz", "steps.csv"

    run = gs.LiveRun(trace.model, "T4 (16 GB)", 16e9, 123_456, trace.tokens[: trace.n_prompt], export)
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


def test_a_long_prefill_says_how_far_it_got(live):
    out = live.outputs(Snapshot(None, None, Progress("prefill", 2048, 6371), 0, False))
    assert out[1].startswith("Prefill: 2,048 / 6,371 prompt tokens")
    assert len(out[2]) == 4 and {label for _, label in out[2]} == {"prompt"}  # the prompt's chips, at once
    assert skipped(out[0]) and skipped(out[4]) and out[3] == ""


def test_the_check_says_it_is_running(live, trace):
    out = live.outputs(running(trace, 6, Progress("verify", 0, 1)))
    assert out[1].startswith("Checking: the whole sequence again from scratch, without the cache")
    assert out[1].endswith("(6 tokens generated)")


def test_charts_are_drawn_less_often_than_the_status(live, trace, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(gs.time, "monotonic", lambda: clock[0])
    first = live.outputs(running(trace, 2))
    assert first[1].startswith("Generating: 2 tokens") and len(first[2]) == trace.n_prompt + 2
    assert not skipped(first[4]) and not skipped(first[5])
    assert "room for 123,456 cached tokens" in first[5].layout.title.text
    clock[0] += gs.FIGURES_S / 2
    soon = live.outputs(running(trace, 3))
    assert soon[1].startswith("Generating: 3 tokens") and skipped(soon[4]) and skipped(soon[5])
    clock[0] += gs.FIGURES_S
    later = live.outputs(running(trace, 4))
    assert not skipped(later[4]) and len(later[4].data[0].x) == 4
    assert skipped(later[0]) and later[8] is None and live.exported == []


def test_the_end_sends_everything_once(live, trace):
    out = live.outputs(Snapshot(trace, (6, trace.text), Progress("verify", 1, 2), 7, True))
    assert out[0] is trace and out[1].startswith("Done: 6 tokens") and "stop: max_new_tokens" in out[1]
    assert not skipped(out[4]) and not skipped(out[5]) and "equals" in out[6]
    assert out[8:] == ("trace.npz", "steps.csv") and live.exported == [trace]


def test_the_replay_slider_is_set_only_when_the_run_is_done(trace):
    assert skipped(gs.replay_range(running(trace, 3)))
    assert skipped(gs.replay_range(Snapshot(None, None, None, 0, True)))
    done = gs.replay_range(Snapshot(trace, (6, trace.text), None, 7, True))
    assert done.maximum == len(trace.steps) - 1 and done.value == len(trace.steps) - 1
