"""A policy's kept entries stored under a quantization scheme: the round trip and the bytes as served."""

from __future__ import annotations

import torch

from kvviz.eviction.served import quantize_kept, served_bytes
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
