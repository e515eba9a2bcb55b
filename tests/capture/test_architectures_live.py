"""The cache of every architecture, live: each tiny model's real cache tensors against the formula."""

from __future__ import annotations

import json

import pytest

from kvviz.capture.architectures import kinds, run_kind, tiny_config
from kvviz.figures import architectures as fig


@pytest.fixture(scope="module", params=kinds())
def live(request):
    return run_kind(request.param, "The KV cache", max_new_tokens=8)


def test_every_kind_holds_exactly_the_formulas_bytes(live):
    assert live.agrees, live.kind
    kv = sum(t.bytes for t in live.tensors if t.part == "kv")
    assert live.measured_bytes == kv == live.formula_bytes
    assert sum(live.state_bytes) == sum(t.bytes for t in live.tensors if t.part == "state")
    for step in live.steps:  # after the prefill and after every decode step, read from the tensors
        assert step.layer_bytes == step.formula_layer_bytes and step.state_bytes == step.formula_state_bytes
    assert [s.tokens_seen for s in live.steps] == list(range(12, 20))
    assert live.max_abs_logit_diff_vs_unpatched < 1e-4  # a linear hybrid's too: its attention layer is captured
    assert live.tokens_seen == len(b"The KV cache") + 7 and live.elapsed_s < 10


def test_each_kind_stores_what_its_architecture_says(live):
    cfg = tiny_config(live.kind)
    shapes = {(t.name, t.shape[1], t.shape[3]) for t in live.tensors if len(t.shape) == 4 and t.part == "kv"}
    expected = {
        "MHA": ("MHA", 4),
        "GQA": ("GQA", 2),
        "MQA": ("MQA", 1),
        "sliding": ("GQA", 2),
        "hybrid": ("GQA", 2),
        "learned-sink": ("GQA", 2),
    }
    if live.kind in ("MLA", "DSA"):  # one latent and one RoPE key per token: one "head", no factor 2
        assert {x for x in shapes if x[0] != "indexer keys"} == {
            ("latent", 1, cfg["kv_lora_rank"]),
            ("RoPE key", 1, cfg["qk_rope_head_dim"]),
        }
        assert live.bytes_per_token == 2 * (32 + 8 + (16 if live.kind == "DSA" else 0)) * 4
        assert live.per_head_bytes_per_token == 2 * 4 * (24 + 16) * 4  # what attention expands it to
    elif live.kind in ("KV-sharing", "linear hybrid"):  # their own tests: tests/capture/test_architectures_2026.py
        assert {x for x in shapes if x[0] in ("keys", "values")} == {
            ("keys", cfg["num_key_value_heads"], 16),
            ("values", cfg["num_key_value_heads"], 16),
        }
    else:
        attention, heads = expected[live.kind]
        assert live.attention == attention and shapes == {("keys", heads, 16), ("values", heads, 16)}
    windows = {t.shape[2] for t in live.tensors if t.layer_kind == "sliding" and t.name == "keys"}
    assert windows <= {cfg.get("sliding_window", 0) - 1}  # transformers keeps window - 1 between steps
    assert (live.learned_sink_share is not None) == (live.kind == "learned-sink")


def test_figures_and_summary(live):
    table = fig.cache_table(live)
    assert list(table["measured bytes"]) == list(live.formula_layer_bytes) and set(table["equal"]) == {"✓"}
    chart = fig.bytes_chart(live)
    segments = [t for t in chart.data if t.offsetgroup == "measured"]
    # the measured bar, stacked: every byte the tensors hold, the fixed states and indexer keys included
    totals = [sum(t.y[i] for t in segments) for i in range(len(live.layer_bytes))]
    assert totals == [a + b for a, b in zip(live.layer_bytes, live.state_bytes)]
    assert len(chart.data) == len(segments) + (2 if live.attention == "MLA" else 1)
    steps = fig.steps_chart(live)
    assert len(steps.data) == 2 * len(live.layer_bytes) and all(len(t.x) == len(live.steps) for t in steps.data)
    text = fig.summary_markdown(live)
    assert f"**{live.cache_bytes:,} B" in text and "equal, layer by layer, at every step ✓" in text
    if live.kind == "MLA":
        assert "no factor 2 and no head count" in text and "4× more" in text


def test_captions_are_one_sentence():
    assert all(c.strip().endswith(".") and c.count(". ") == 0 for c in fig.CAPTIONS.values())
    json.dumps(fig.CAPTIONS)


@pytest.mark.parametrize(
    "args, message",
    [
        (("GQA", ""), "prompt is empty"),
        (("GQA", "x" * 201), "at most 200"),
        (("RWKV", "hi"), "Unknown architecture"),
    ],
)
def test_bad_input_is_refused(args, message):
    with pytest.raises(ValueError, match=message):
        run_kind(*args)
