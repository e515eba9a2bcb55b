"""Capture on tiny random-weight models of other architectures: GPT-2 MHA, MQA, explicit head_dim, sliding, hybrid."""

from __future__ import annotations

import numpy as np
import pytest

from kvviz.capture.loop import capture
from tests.tiny_models import CONFIG_NAMES, tiny_model

PROMPT = list(range(100, 120))  # 20 tokens, longer than the sliding window of 8


@pytest.fixture(scope="module", params=CONFIG_NAMES)
def run(request, lm):
    model = tiny_model(request.param, lm.tokenizer)
    return request.param, capture(model, "", prompt_ids=PROMPT, max_new_tokens=6, verify=True)


def _tokens_held(kind: str, window: int | None, seen: int) -> int:
    # transformers keeps window-1 entries of a sliding layer between steps
    return min(seen, window - 1) if kind == "sliding_attention" else seen


def test_bytes_equal_the_formula_per_layer(run):
    name, trace = run
    m = trace.model
    per_token_layer = 2 * m.kv_heads * m.head_dim * m.bytes_per_element
    for s in trace.steps:
        seen = s.position  # tokens fed so far
        for kind, n, b in zip(m.layer_kinds, s.cache_lens, s.layer_bytes):
            assert n == _tokens_held(kind, m.sliding_window, seen), name
            assert b == n * per_token_layer, name


def test_sliding_layers_stop_growing_and_full_layers_grow(run):
    name, trace = run
    for i, kind in enumerate(trace.model.layer_kinds):
        lens = [s.cache_lens[i] for s in trace.steps]
        if kind == "sliding_attention":
            assert set(lens) == {trace.model.sliding_window - 1}, name
        else:
            assert lens == list(range(len(PROMPT), len(PROMPT) + len(lens))), name


def test_cached_equals_recompute(run):
    name, trace = run
    assert trace.equivalence["max_abs_logit_diff"] < 1e-3, name


def test_attention_rows_sum_to_one(run):
    _, trace = run
    assert np.allclose(trace.colsum.sum(-1), trace.n_fed, rtol=1e-5)
    assert np.allclose(trace.decode_rows.astype(np.float32).sum(-1), 1.0, atol=2e-3)


def test_shapes_follow_the_config(run):
    name, trace = run
    m = trace.model
    expected = {"gpt2_mha": (4, 4, 16), "llama_mqa": (4, 1, 16), "qwen3_head_dim": (4, 2, 32),
                "mistral_sliding": (4, 2, 16), "gemma2_hybrid": (4, 2, 16)}[name]
    assert (m.q_heads, m.kv_heads, m.head_dim) == expected
