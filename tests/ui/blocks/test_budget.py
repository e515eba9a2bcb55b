"""The Blocks tab's "Serving under a KV budget": drawn from the stored replays at build, redrawn from them when
the budget slider moves or the trace changes, and a plain note when no replay is stored."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.capture.model_io import model_info
from kvviz.engine.budget_ledger import LOSSY, MODES, Ledger
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
    # redrawn on the visitor's move only: a new trace sets the slider and draws in its own answer
    assert not [f for f in demo.fns.values() if (slider._id, "change") in f.targets]
    (change,) = [f for f in demo.fns.values() if (slider._id, "input") in f.targets]
    named = {c.elem_id: c for c in change.outputs}

    def shown(i) -> dict:
        return {named_id: out[c] for named_id, c in named.items() for out in [change.fn("room", i)]}

    small, large = shown(0), shown(1)
    assert small["kvbudget-note"] != large["kvbudget-note"] and "MiB of KV" in small["kvbudget-note"]
    assert [t.name for t in small["kvbudget-running"].data] == ["contiguous (prompt + new tokens)", "paged"]
    assert list(large["kvbudget-table"]["mode"]) == ["contiguous (prompt + new tokens)", "paged"]
    assert shown(99)["kvbudget-note"] == large["kvbudget-note"]  # a typed index past the end: the largest budget


@pytest.mark.parametrize(
    ("mib", "students", "match"),
    [
        ("twelve", 4, "KV budget"),
        (0, 4, "KV budget"),
        (-3, 4, "KV budget"),
        (1e300, 4, "KV budget"),
        ([12], 4, "KV budget"),
        (12, 99, "Students"),
        (12, "4; drop", "Students"),
    ],
)
def test_a_live_replay_refuses_bad_input_by_name(mib, students, match):
    ctx = AppContext(lm=None, settings=Settings())
    with pytest.raises(ValueError, match=match):
        budget.serve_sim(ctx, mib, students)


@pytest.mark.slow
def test_a_live_replay_runs_every_mode_at_the_typed_budget(lm):
    ctx = AppContext(lm=lm, settings=Settings())
    case = budget.api_serve_sim(ctx, 6, 1)
    by_mode = {r["mode"]: r for r in case["replays"]}
    assert list(by_mode) == list(MODES) and len(case["requests"]) == 2  # the example and one student
    # a reservation to the model's context (8,192 tokens of fp32 K/V, 360 MiB) holds no sequence in 6 MiB: said why
    assert not by_mode.pop("contiguous-context")["fits"]
    for mode, r in by_mode.items():
        assert r["budget"] == 6 * 2**20 and r["fits"], mode
        assert max(r["steps"]["tensor_bytes"]) <= 6 * 2**20, mode
        if mode not in LOSSY:
            assert r["summary"]["all_same_as_solo"], mode
    drawn = budget.drawn({"cases": {budget.LIVE: case}}, budget.LIVE, 0)
    assert drawn["note"].startswith("At 6.0 MiB of KV:") and len(drawn["table"]) == len(MODES)


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


def test_each_trace_is_named_with_the_size_the_stored_file_holds(monkeypatch, stored):
    """The choice of trace says how many requests the stored replay served (it once said 73 over a stored room of
    13), and a long-prompt trace its prompts' length."""
    long = {**stored["cases"]["room"], "requests": stored["cases"]["room"]["requests"][:2]}
    result = {"settings": {"long_tokens": 1000}, "cases": {**stored["cases"], "long": long}}
    ctx, demo = _build(monkeypatch, result)
    (radio,) = [c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "kvbudget-case"]
    titles = [label for label, _ in radio.choices]
    assert titles == [
        "the room (3 short chat questions in waves)",
        "long prompts (2 chapter windows, 1,000 tokens each)",
    ]
