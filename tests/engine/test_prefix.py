"""The prefix store: a hit gives the Trace a cold run gives; the store stays within its bytes."""

from __future__ import annotations

import numpy as np
import pytest

from kvviz.capture.recorder import RecorderConfig
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from tests.engine.test_engine import ARRAYS, HALF, solo

pytestmark = pytest.mark.slow

QUESTIONS = ["What is two plus two?", "Name a large animal.", "Why do leaves fall in autumn?"]


def test_prefix_hits_give_the_cold_runs_trace(lm):
    engine = Engine(lm)
    first = engine.submit(QUESTIONS[0], chat=True, max_new_tokens=5, verify=True)
    assert wait_all([first], 600)
    assert first.trace.cached_prompt_tokens == 0
    rest = [engine.submit(q, chat=True, max_new_tokens=5, verify=True) for q in QUESTIONS[1:]]
    assert wait_all(rest, 600)
    stats = engine.snapshot()["prefix_cache"]
    assert stats["hit_blocks"] >= 2 and stats["hit_rate"] > 0
    for h, q in zip(rest, QUESTIONS[1:]):
        # the chat template and system prompt every request starts with came from the cache
        b = engine.prefix.block_size
        assert h.trace.cached_prompt_tokens >= 16
        assert h.trace.cached_prompt_tokens % b == 0 and h.trace.cached_prompt_tokens < h.trace.n_prompt
        cold = solo(lm, q, chat=True, max_new_tokens=5).trace
        assert h.trace.token_ids == cold.token_ids
        for name in ARRAYS:
            np.testing.assert_allclose(getattr(h.trace, name), getattr(cold, name), atol=2e-5, rtol=1e-4, err_msg=name)
        for name in HALF:
            a, b = getattr(h.trace, name).astype(np.float32), getattr(cold, name).astype(np.float32)
            np.testing.assert_allclose(a, b, atol=2e-3, err_msg=name)
        assert h.trace.equivalence["max_abs_logit_diff"] < 1e-3


def test_a_cold_room_computes_its_shared_system_prompt_once(lm):
    engine = Engine(lm, gather_s=0.5, gather_max_s=5.0)  # the three presses start in one batch
    handles = [engine.submit(q, chat=True, max_new_tokens=3) for q in QUESTIONS]
    assert wait_all(handles, 600)
    cached = [h.trace.cached_prompt_tokens for h in handles]
    # the first computes the template's blocks; the others waited a step for them instead of computing them too
    assert cached[0] == 0 and all(c >= 16 for c in cached[1:]), cached
    for h, q in zip(handles, QUESTIONS):
        cold = solo(lm, q, chat=True, max_new_tokens=3).trace
        assert h.trace.token_ids == cold.token_ids
        np.testing.assert_allclose(h.trace.colsum, cold.colsum, atol=2e-5, rtol=1e-4)


def test_long_shared_prefix_with_binned_maps(lm):
    """A prompt long enough for several blocks, with display bins wider than one token: the cached
    rows are folded into the bins exactly where the cold run put them."""
    text = "The cache keeps keys and values so that each new token reads them instead of recomputing. " * 6
    engine = Engine(lm)
    a = engine.submit(text + "Summarize.", chat=True, max_new_tokens=3, cfg=RecorderConfig(bin_factor=3))
    assert wait_all([a], 600)
    b = engine.submit(text + "Shorter, please.", chat=True, max_new_tokens=3, cfg=RecorderConfig(bin_factor=3))
    assert wait_all([b], 600)
    assert b.trace.cached_prompt_tokens >= 64 and b.trace.bin_factor == 3
    cold = solo(lm, text + "Shorter, please.", chat=True, max_new_tokens=3, cfg=RecorderConfig(bin_factor=3)).trace
    np.testing.assert_allclose(b.trace.colsum, cold.colsum, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(b.trace.window_rows, cold.window_rows, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(b.trace.prefill_map.astype(np.float32), cold.prefill_map.astype(np.float32), atol=2e-3)


def test_store_is_bounded_in_bytes_and_evicts_least_recently_used(lm):
    engine = Engine(lm, prefix_cache_bytes=2 * 2**20)  # room for one block of SmolLM2 (about 1 MiB each)
    for q in ["Alpha " * 20, "Beta " * 20, "Gamma " * 20]:
        assert wait_all([engine.submit(q, chat=False, max_new_tokens=2)], 600)
    stats = engine.snapshot()["prefix_cache"]
    assert 0 < stats["bytes_held"] <= 2 * 2**20
    assert stats["evicted_blocks"] >= 1


def test_a_warmed_engine_serves_a_cold_room_the_whole_chat_template_at_once(lm):
    engine = Engine(lm, gather_s=0.5, gather_max_s=5.0)
    warm = engine.warm("What is a KV cache? Answer in one sentence.")
    assert warm.n_generated == 1 and warm.cached_prompt_tokens == 0
    handles = [engine.submit(q, chat=True, max_new_tokens=3) for q in QUESTIONS]
    assert wait_all(handles, 600)
    b = engine.prefix.block_size
    for h, q in zip(handles, QUESTIONS):
        ids, seen = h.trace.token_ids[: h.trace.n_prompt], warm.token_ids[: warm.n_prompt]
        common = next(i for i, (x, y) in enumerate(zip(ids, seen)) if x != y)
        # every full block of what this prompt shares with the warm-up's came from the store, the first run's too
        assert h.trace.cached_prompt_tokens == common // b * b >= 24, (common, h.trace.cached_prompt_tokens)
        cold = solo(lm, q, chat=True, max_new_tokens=3).trace
        assert h.trace.token_ids == cold.token_ids
        np.testing.assert_allclose(h.trace.colsum, cold.colsum, atol=2e-5, rtol=1e-4)


def test_a_store_that_may_hold_nothing_keys_nothing(lm):
    engine = Engine(lm, prefix_cache_bytes=0, gather_s=0.5, gather_max_s=5.0)
    handles = [engine.submit(q, chat=True, max_new_tokens=2) for q in QUESTIONS]
    assert wait_all(handles, 600)
    # no run waited a step for blocks that could never be stored: all three prefilled in the first forward
    assert engine.counters["max_batch_seen"] == len(QUESTIONS)
    assert all(h.trace.cached_prompt_tokens == 0 for h in handles)
    assert engine.snapshot()["prefix_cache"]["queried_blocks"] == 0
