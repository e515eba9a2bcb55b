"""A policy's kept entries stored under a quantization scheme: the round trip, the bytes, the four-way table."""

from __future__ import annotations

import torch

from kvviz.capture.loop import encode_prompt
from kvviz.eviction.compose import compose, quantize_kept, schemes, served_bytes
from kvviz.eviction.policies import make_policy
from kvviz.quant.schemes import kivi, simulate, stored_bytes


def test_the_kept_entries_are_stored_as_the_scheme_returns_them(tiny_cache):
    cache, keys, values = tiny_cache
    cache.keep(torch.tensor([[[0, 2, 5], [1, 3, 4]], [[0, 1, 2], [3, 4, 5]]]))
    held = [layer.keys.clone() for layer in cache.layers]
    scheme = kivi(2, group_size=2, residual=1)
    quantize_kept(cache, scheme)
    for layer, before in zip(cache.layers, held):
        assert torch.equal(layer.keys, simulate(before, scheme.key))
        assert torch.equal(layer.keys[..., -1:, :], before[..., -1:, :])  # the newest kept entry stays exact
        assert not torch.equal(layer.keys, before)
    per_layer = stored_bytes((2, 3, 8), scheme.key).total + stored_bytes((2, 3, 8), scheme.value).total
    assert served_bytes(cache, scheme) == 2 * per_layer
    assert served_bytes(cache, None) == 2 * 2 * 3 * 8 * 2 * 2  # layers × heads × entries × D × (K, V) × 16-bit


def test_ragged_heads_are_served_without_their_padding(tiny_cache):
    cache, _, _ = tiny_cache
    cache.keep(torch.tensor([[[0, 2, 5], [1, -1, -1]], [[3, 4, -1], [0, 5, -1]]]))
    assert served_bytes(cache, None) == 8 * 8 * 2 * 2  # eight entries held


def test_compose_measures_the_four_caches(lm):
    ids = encode_prompt(lm, "The code for the locker is 3390. The library closes at six. What is the code?", True)
    assert set(schemes()) == {"KIVI-4", "KIVI-2", "INT8 per token", "FP8 per token"}
    scheme = kivi(4, group_size=8, residual=8)  # a short prompt: a small window leaves something to quantize
    comp = compose(lm, ids, make_policy("knorm"), scheme, ratio=0.5, max_new_tokens=3)
    full, policy, quant, both = comp.rows
    assert full.name == "full cache" and full.top1_agreement == 1.0 and full.served_bytes == comp.full_bytes
    assert full.served_bytes == len(ids) * 30 * 3 * 64 * 2 * 2
    assert policy.served_bytes == int(len(ids) * 0.5) * 30 * 3 * 64 * 2 * 2
    assert both.served_bytes < policy.served_bytes and both.served_bytes < quant.served_bytes < full.served_bytes
    for row in (policy, quant, both):
        assert 0.0 <= row.top1_agreement <= 1.0 and row.mean_kl >= 0.0 and isinstance(row.answer, str)
    assert list(comp.frame()["cache"]) == [r.name for r in comp.rows]
