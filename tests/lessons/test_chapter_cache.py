"""The chapter's KVCache.append / attend code on the bundled model's layer 0: its printed cache shape, a
rounding-sized max diff with causal=False in decode, and a large one with causal=True (the named trap)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from kvviz.capture.model_io import cache_kwarg
from kvviz.lessons.chapter_cache import TOTAL, chapter_check, layer0_input, project


def test_the_chapters_check_on_layer_0(lm):
    check = chapter_check(lm)
    assert (check.q_heads, check.kv_heads) == (9, 3)  # GQA: three query heads per KV head
    assert check.cache_shape == (2, 3, TOTAL, 64)
    assert check.max_diff < 1e-5  # cached decode = full recompute (fp32 rounding)
    assert check.max_diff_causal_decode > 1e-2  # the single query saw only the first key
    assert check.text().splitlines()[0] == f"cache shape: (2, 3, 12, 64) max diff: {check.max_diff}"


def test_the_projection_is_the_models_own_layer_0(lm):
    """The chapter's project() with layer 0's weights gives the keys and values the model itself caches."""
    ids = torch.tensor(
        [lm.tokenizer("A cache of keys and values for every token so far", add_special_tokens=False)["input_ids"]]
    )
    cache = DynamicCache(config=lm.config)
    with torch.inference_mode():
        lm.model(input_ids=ids, use_cache=True, **{cache_kwarg(lm.model): cache})
        _, k, v = project(lm, layer0_input(lm, ids), 0)
    torch.testing.assert_close(k, cache.layers[0].keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v, cache.layers[0].values, atol=1e-5, rtol=1e-5)
