"""The Blocks tab's "Serving under a KV budget": drawn from the stored replays at build, redrawn from them when
the budget slider moves or the trace changes, and a plain note when no replay is stored."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.capture.model_io import model_info
from kvviz.engine.budget_ledger import Ledger
from kvviz.engine.budget_store import sweep
from kvviz.engine.budget_trace import Request
from kvviz.settings import Settings
from kvviz.ui.blocks import budget
from kvviz.ui.serving.context import AppContext
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def stored():
    lm = tiny_model("llama")
    reqs = [Request(f"r{i}", 0, 3, False, tuple(range(10 + 8 * i, 20 + 8 * i))) for i in range(3)]
    per_token = Ledger(model_info(lm), "paged").per_token
    case = sweep(lm, reqs, [30 * per_token, 60 * per_token], modes=("contiguous", "paged"))
    return {"cases": {"room": case}}


def _build(monkeypatch, result):
    monkeypatch.setattr(budget, "load", lambda: result)
    ctx = AppContext(lm=None, settings=Settings())
    with gr.Blocks() as demo:
        budget.build(ctx)
    return ctx, demo


def test_the_slider_redraws_every_mode_from_the_stored_replays(monkeypatch, stored):
    ctx, demo = _build(monkeypatch, stored)
    slider = ctx.components["blocks.kv_budget"]
    assert slider.maximum == 1
    (change,) = [f for f in demo.fns.values() if (slider._id, "change") in f.targets]
    small, large = change.fn("room", 0), change.fn("room", 1)
    assert small[0] != large[0] and "MiB of KV" in small[0]
    assert [t.name for t in small[1].data] == ["contiguous (prompt + new tokens)", "paged"]
    assert list(large[4]["mode"]) == ["contiguous (prompt + new tokens)", "paged"]
    assert change.fn("room", 99)[0] == large[0]  # a typed index past the end shows the largest budget


def test_without_stored_replays_the_section_says_how_to_make_them(monkeypatch):
    def missing():
        raise FileNotFoundError("bench/results/kv_budget.json")

    monkeypatch.setattr(budget, "load", missing)
    ctx = AppContext(lm=None, settings=Settings())
    with gr.Blocks() as demo:
        budget.build(ctx)
    notes = [b.value for b in demo.blocks.values() if isinstance(b, gr.Markdown)]
    assert any("bench/kv_budget.py" in str(n) and "No stored replays" in str(n) for n in notes)
    assert "blocks.kv_budget" not in ctx.components
