"""Generate-view figures are pure functions of a real trace."""

from __future__ import annotations

import pytest

from kvviz.capture.loop import capture
from kvviz.figures import generate as fig
from kvviz.units import format_bytes, format_gb


@pytest.fixture(scope="module")
def trace(lm):
    return capture(lm, "Once upon a time", chat=False, max_new_tokens=6)


def test_cache_growth_plots_measured_bytes(trace):
    f = fig.cache_growth(trace)
    assert list(f.data[0].y) == [s.cache_bytes / 2**20 for s in trace.steps]
    assert "30 layers" in f.data[0].customdata[0]  # per-layer breakdown on hover


def test_gauge_says_how_many_tokens_fit(trace):
    f = fig.memory_gauge(trace.cache_bytes, trace.model.weight_bytes, 16e9, "T4", 123_456)
    assert "room for 123,456 cached tokens" in f.layout.title.text


def test_room_for_tokens_uses_the_memory_module(lm):
    from kvviz.ui.tab_generate import room_for_tokens

    info_bytes = 2 * 30 * 3 * 64 * 4
    weights = sum(p.numel() * 4 for p in lm.model.parameters())
    assert room_for_tokens(lm, 16e9, weights) == int((16e9 - weights) // info_bytes)


def test_token_spans_split_prompt_and_generated(trace):
    spans = fig.token_spans(trace)
    assert [label for _, label in spans].count("prompt") == trace.n_prompt
    assert len(spans) == trace.n_tokens


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
