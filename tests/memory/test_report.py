"""The memory report: typed parts present exactly when asked for, one JSON, one text for the CLI and the tab."""

from __future__ import annotations

from kvviz.memory.layout import cache_layout
from kvviz.memory.report import MemoryRequest, report, summary

CHAPTER = dict(context=8192, batch=162, gpus=8, gpu_mem_gb=80, reserve=0.1, weights_gb=140, bandwidth_tbps=3.35)


def test_capacity_and_decode_are_there_only_when_their_inputs_are():
    layout = cache_layout("Llama-3-70B")
    sizes = report(MemoryRequest(layout, 8192))
    assert sizes.capacity is None and sizes.decode is None and sizes.weight_bytes is None
    assert "kv_budget_bytes" not in sizes.to_json() and "decode_ms_kv" not in sizes.to_json()
    timed = report(MemoryRequest(layout, 8192, bandwidth_tbps=3.35, weights_gb=140))
    assert timed.capacity is None and timed.decode.ms_weights == timed.to_json()["decode_ms_weights"]
    full = report(MemoryRequest(layout, **CHAPTER))
    out = full.to_json()
    assert full.capacity.budget.kv_budget_bytes == out["kv_budget_bytes"] == 436 * 10**9
    assert (full.capacity.max_sequences, full.capacity.fits) == (out["max_sequences"], out["fits"]) == (162, True)
    assert list(out)[-4:] == ["bandwidth_bytes_per_s", "decode_ms_weights", "decode_ms_kv", "decode_ms_total"]


def test_the_cli_and_the_tab_print_the_same_sentences():
    r = report(MemoryRequest(cache_layout("Llama-3-70B"), **CHAPTER))
    plain = summary(r).splitlines()
    markdown = summary(r, markdown=True).replace("**", "").split("\n\n")
    assert plain[-len(markdown) :] == markdown  # the CLI adds the model line and the layer groups before them
    assert "80 full layers: 2 × 8 KV heads × 128 × 2 B" in plain[1]
    assert "**KV budget 436 GB = 406.1 GiB**" in summary(r, markdown=True)


def test_mla_has_no_kv_heads_in_either_text():
    r = report(MemoryRequest(cache_layout("DeepSeek-V3"), 131_072, tp=8))
    for text in (summary(r), summary(r, markdown=True)):
        assert "KV head" not in text.replace("no KV heads in the cache", "")
        assert "one latent per layer, copied on each of the 8 TP ranks, so × 8" in text
    assert "128 query heads, but no KV heads in the cache: one 512-dim latent" in summary(r)


def test_a_context_beyond_the_config_shows_the_configured_case():
    """At 128K the summary names the 8,192 Llama-3-70B's config is set for, with one sequence's 2.5 GiB there."""
    r = report(MemoryRequest(cache_layout("Llama-3-70B"), **{**CHAPTER, "context": 131_072, "batch": 1}))
    assert "**10 sequences** at 131,072 tokens" in summary(r, markdown=True)
    assert "(the config is set for 8,192 tokens, where one sequence holds 2.5 GiB)" in summary(r)
    assert "configured for" not in summary(report(MemoryRequest(cache_layout("Llama-3-70B"), **CHAPTER)))
