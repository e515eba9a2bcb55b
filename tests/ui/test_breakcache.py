"""Break the cache tab: its endpoint's JSON and the view's map, verdict and tokens, in-process on the real
model; bad input refused by name; the tab registered and Learn's objective 2 showing two faults."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.capture.divergence import debug
from kvviz.capture.faults import make_fault
from kvviz.figures import debugger as fig
from kvviz.lessons.objectives import CAUSAL_DECODE, FORGET_APPEND, OBJECTIVES
from kvviz.settings import Settings
from kvviz.ui import breakcache as tab
from kvviz.ui.app import TABS
from kvviz.ui.serving.context import AppContext


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings())


@pytest.mark.slow
def test_the_endpoint_answers_with_the_first_divergence(ctx):
    out = tab.api_break_cache(ctx, "appended_twice", 2, 3, "Name a colour.", 4)
    assert out["first"]["step"] == 2 and out["first"]["layer"] == 3 and out["first"]["quantity"] == "cache length"
    assert out["clean_tokens"] and out["fault"]["source"]


@pytest.mark.slow
def test_the_view_marks_the_first_divergence_and_sets_tokens_side_by_side(lm):
    report = debug(lm, "Name a colour.", make_fault("causal_decode", step=1, layer=0), max_new_tokens=4, clean=True)
    shown = tab.present(report, "computed now")
    figure, text, table = shown.map, shown.text, shown.tokens
    marks = [t for t in figure.data if t.type == "scatter"]
    assert len(marks) == 1 and (marks[0].x[0], marks[0].y[0]) == (1, 0)
    assert figure.layout.title.text.startswith("First divergence: step 1, layer 0")
    assert "**Decode with a causal mask.**" in text and "causal=False" in text
    assert list(table.columns) == ["step", "this run", "correct run", "same"] and len(table) == 4


@pytest.mark.slow
def test_no_fault_is_an_all_clear_map(lm):
    report = debug(lm, "Name a colour.", None, max_new_tokens=3, clean=True)
    shown = tab.present(report, "computed now")
    figure, text, table = shown.map, shown.text, shown.tokens
    assert figure.layout.title.text.startswith("All clear") and not [t for t in figure.data if t.type == "scatter"]
    assert text.startswith("**All clear.** No divergence") and set(table["same"]) == {"yes"}
    assert fig.CAPTIONS["map"].count(".") == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("sinks_dropped", 2, 0), "Unknown fault 'sinks_dropped'"),
        (("causal_decode", 9, 0), "Fault step"),
        (("causal_decode", 2, 30), "Fault layer"),
        (("sliding_window_off_by_one", 2, 0), "no sliding"),
    ],
)
def test_bad_input_is_refused_by_name(ctx, args, match):
    with pytest.raises(gr.Error, match=match):
        tab.break_cache(ctx, *args, "Name a colour.", 8)


def test_registered_and_shown_from_learn():
    assert ("Break the cache", "tab_breakcache", tab) in TABS
    assert OBJECTIVES[1].number == 2 and OBJECTIVES[1].show_me[1:] == (CAUSAL_DECODE, FORGET_APPEND)
    labels = {s.label: s for s in OBJECTIVES[1].show_me}
    assert labels["Decode with a causal mask"].values["breakcache.fault"] == "causal_decode"
    assert labels["Forget to append"].values["breakcache.fault"] == "not_appended"
