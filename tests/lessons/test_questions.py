"""Every "check your understanding" answer, computed by kvviz, matches what the chapter states."""

from __future__ import annotations

import pytest

from kvviz.lessons.questions import (
    doubling_the_batch,
    llama3_8b_per_token,
    streaming_recall,
    why_kivi,
    why_no_query_cache,
)
from kvviz.units import format_bytes


def test_llama3_8b_per_token_bf16_and_fp8():
    a = llama3_8b_per_token()
    assert a.values["bf16_bytes"] == 2 * 32 * 8 * 128 * 2 == 131_072
    assert format_bytes(a.values["bf16_bytes"]) == "128 KiB"
    assert format_bytes(a.values["fp8_bytes"]) == "64 KiB"
    assert "131,072 bytes = 128 KiB" in a.text


def test_doubling_the_batch_keeps_weights_and_doubles_kv():
    a = doubling_the_batch()
    w1, w2 = a.values["weight_bytes"]
    assert w1 == w2
    assert a.values["kv_ratio"] == 2.0
    assert "16.2 → 32.5 ms" in a.text  # the chapter's ≈ 16 ms at 162 × 8K, doubled
    # the chapter's 406 GiB budget holds 162 × 2.5 GiB, not 324: the answer must say the doubled batch does not fit
    assert a.values["kv_budget_bytes"] == 436 * 10**9 and a.values["max_sequences"] == 162
    assert a.values["fits"] == (True, False)
    assert "405 GiB → 810 GiB" in a.text
    assert "324 sequences no longer fit: 810 GiB of KV is more than the 406.1 GiB budget" in a.text


def test_streaming_llm_cannot_recall_5000_tokens_back():
    a = streaming_recall()
    assert a.values["kept"] is False  # the chapter: "No."
    assert a.values["n_kept"] == 4 + 1020
    near = streaming_recall(back=500)  # a fact inside the recent window is still there
    assert near.values["kept"] is True


@pytest.mark.slow
def test_queries_are_never_cached_and_the_output_still_matches(lm):
    a = why_no_query_cache(lm)
    assert a.values["max_abs_logit_diff"] < 1e-3
    assert a.values["positions"] >= 1
    with pytest.raises(ValueError):
        why_no_query_cache(None)


@pytest.mark.slow
def test_kivi_reasons_measured_on_the_model(lm):
    a = why_kivi(lm)
    assert a.values["key_outlier_ratio"] > 2 * a.values["value_outlier_ratio"]  # keys have outlier channels
    assert a.values["key_error_per_channel"] * 2 < a.values["key_error_per_token"]
