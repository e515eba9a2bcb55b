"""Generate-view figures are pure functions of a real trace."""

from __future__ import annotations

import copy

import pytest

from kvviz.capture.loop import capture
from kvviz.figures import generate as fig
from kvviz.units import format_bytes, format_gb

pytestmark = pytest.mark.slow  # the figures draw a real capture


@pytest.fixture(scope="module")
def trace(lm):
    return capture(lm, "Once upon a time", chat=False, max_new_tokens=6)


def test_cache_growth_plots_measured_bytes(trace):
    f = fig.cache_growth(trace)
    assert list(f.data[0].y) == [s.cache_bytes / 2**20 for s in trace.steps]
    assert "30 layers" in f.data[0].customdata[0]  # per-layer breakdown on hover


def test_the_prefill_label_sits_where_the_chart_is_empty(trace):
    """Right of the first point, above the axis when the point is low (under it, the label covered the step axis's
    numbers), below it when the point is high."""
    (label,) = fig.cache_growth(trace).layout.annotations
    assert label.text == f"prefill: {trace.n_prompt} tokens" and label.x == 0 and label.xanchor == "left"
    low = trace.steps[0].cache_bytes < fig.PREFILL_LABEL_ABOVE * max(s.cache_bytes for s in trace.steps)
    assert (label.ay < 0) == low  # plotly's ay: pixels down from the point
    short = copy.copy(trace)
    short.steps = trace.steps[:1]  # a run's first snapshot: the prefill is the top of the chart
    assert fig.cache_growth(short).layout.annotations[0].ay > 0
    assert fig.cache_growth(trace, upto=0).layout.annotations[0].ay == label.ay  # a replay: the full run's axis


def test_cache_growth_replays_up_to_a_step_on_the_full_runs_axes(trace):
    f = fig.cache_growth(trace, upto=2)
    assert list(f.data[0].x) == [0, 1, 2]
    assert f.data[0].y[-1] == trace.steps[2].cache_bytes / 2**20
    assert f.layout.xaxis.range[1] >= len(trace.steps) - 1  # the axes do not move while it plays
    assert f.layout.yaxis.range[1] >= max(s.cache_bytes for s in trace.steps) / 2**20
    assert f"{trace.steps[2].cache_lens[0]} tokens" in f.layout.title.text
    assert list(fig.cache_growth(trace, upto=10**6).data[0].x) == [s.index for s in trace.steps]  # clamped


def test_token_spans_replay_shows_the_tokens_produced_so_far(trace):
    spans = fig.token_spans(trace, upto=0)
    assert len(spans) == trace.n_prompt + 1  # the prefill produced the first generated token
    assert len(fig.token_spans(trace, upto=2)) == trace.n_prompt + 3


def test_gauge_says_how_many_tokens_fit(trace):
    f = fig.memory_gauge(trace.cache_bytes, trace.model.weight_bytes, 16e9, "T4", 123_456)
    assert "room for 123,456 cached tokens" in f.layout.title.text


def test_room_for_tokens_uses_the_memory_module(lm):
    from kvviz.ui.generate.tab import room_for_tokens

    info_bytes = 2 * 30 * 3 * 64 * 4
    weights = sum(p.numel() * 4 for p in lm.model.parameters())
    assert room_for_tokens(lm, 16e9, weights) == int((16e9 - weights) // info_bytes)


def test_token_spans_split_prompt_and_generated(trace):
    spans = fig.token_spans(trace)
    assert [label for _, label in spans].count("prompt") == trace.n_prompt
    assert len(spans) == trace.n_tokens


@pytest.mark.parametrize(
    "token,chip",
    [(" Paris", " Paris"), ("\n", "↵\n"), ("\n\n", "↵↵\n"), (" ", "␣"), ("\t ", "⇥␣"), (".\n", ".↵\n"), ("", "∅")],
)
def test_every_token_is_one_visible_chip(token, chip):
    # the strip draws no chip for blank text and breaks lines at "\n": each token keeps one chip, then its break
    assert fig.chip_text(token) == chip
    lines = fig.chip_text(token).split("\n")
    assert sum(bool(line.strip()) for line in lines) == 1


def test_cache_growth_draws_a_bounded_number_of_points(trace):
    many = copy.copy(trace)
    many.steps = [trace.steps[i % len(trace.steps)] for i in range(1000)]
    f = fig.cache_growth(many, max_points=50)
    assert len(f.data[0].x) == 50 and f.data[0].x[0] == many.steps[0].index
    assert f.data[0].y[-1] == many.steps[-1].cache_bytes / 2**20


def test_model_card_substitutes_the_formula(trace):
    card = fig.model_card(trace.model)
    assert "2 × 30 × 3 × 64 × 4 = **46,080 bytes = 45 KiB**" in card
    assert "GQA (groups of 3)" in card


@pytest.mark.parametrize(
    "n,text",
    [
        (512, "512 bytes"),
        (327_680, "320 KiB"),
        (2.5 * 2**30, "2.5 GiB"),
        (2.5 * 2**20, "2.5 MiB"),
        (40 * 2**30, "40 GiB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_format_gb_is_decimal():
    assert format_gb(140e9) == "140 GB" and format_gb(1.4e9) == "1.4 GB"


def test_the_check_verdict_says_what_one_recomputation_settled(trace):
    checked = copy.copy(trace)
    one = {
        "max_abs_logit_diff": 4e-5,
        "max_abs_attn_output_diff": 2e-6,
        "positions_checked": 6,
        "max_abs_logit_diff_vs_unpatched": 4e-5,
        "unpatched_reference": True,
        "recomputations": 1,
    }
    checked.equivalence = one
    text = fig.equivalence_text(checked)
    assert text.startswith("**Cached decoding equals full recomputation** over 6 generated positions")
    assert "no cache, no kvviz capture" in text and "4.00e-05" in text and "2.00e-06" in text
    assert "computed once" not in text
    checked.equivalence = dict(one, shared_prefix_tokens=28)  # checked beside runs with the same system prompt
    assert "from scratch (its first 28 tokens, the same in the runs checked beside it, computed once for them all)" in (
        fig.equivalence_text(checked)
    )
    # a disagreement attributed by the capture's recomputation: the cache agrees, the capture changed the model
    checked.equivalence = dict(one, max_abs_logit_diff=3e-5, max_abs_logit_diff_vs_unpatched=0.8, recomputations=2)
    text = fig.equivalence_text(checked)
    assert "**Cached decoding equals full recomputation**" in text and "**CHANGED THE OUTPUT**" in text
    checked.equivalence = dict(one, max_abs_logit_diff=0.5, max_abs_logit_diff_vs_unpatched=0.5, recomputations=2)
    assert "DIFFERS FROM" in fig.equivalence_text(checked)
    checked.equivalence = None
    assert "not checked" in fig.equivalence_text(checked)
