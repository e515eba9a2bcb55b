"""The cache that quantizes as it stores: same result as quantizing the whole tensor, and generation on it."""

from __future__ import annotations

import pytest
import torch

from kvviz.capture.loop import capture
from kvviz.quant.cache import QuantizedKVCache, QuantizedLayer, cache_factory, compare_generation
from kvviz.quant.schemes import QuantSpec, Scheme, kivi, simulate, stored_bytes


@pytest.mark.parametrize(
    "scheme",
    [
        kivi(2, group_size=8, residual=8),
        Scheme("int4 per token", QuantSpec("int4", "token", 16), QuantSpec("int4", "token", 16)),
        Scheme("fp8 window", QuantSpec("fp8", "token", None, 3), QuantSpec("fp8", "channel", 4)),
    ],
)
def test_growing_cache_equals_quantizing_the_whole_tensor(scheme):
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(1, 2, 45, 16, generator=g), torch.randn(1, 2, 45, 16, generator=g)
    layer = QuantizedLayer(scheme)
    rk, rv = layer.update(k[:, :, :21], v[:, :, :21])  # prefill: the prompt's own attention is exact
    assert torch.equal(rk, k[:, :, :21]) and torch.equal(rv, v[:, :, :21])
    for t in range(21, 45):
        rk, rv = layer.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        assert torch.equal(rk[:, :, -1], k[:, :, t])  # the new token sees its own exact K
    assert torch.allclose(layer.keys, simulate(k, scheme.key), atol=1e-6)
    assert torch.allclose(layer.values, simulate(v, scheme.value), atol=1e-6)
    assert layer.get_seq_length() == 45


def test_growing_cache_refuses_what_cannot_stream():
    with pytest.raises(ValueError, match="per-tensor"):
        QuantizedLayer(Scheme("t", QuantSpec("fp8", "tensor", None), QuantSpec("fp8", "token", None)))
    with pytest.raises(ValueError, match="group size"):
        QuantizedLayer(Scheme("c", QuantSpec("int2", "channel", None), QuantSpec("int2", "token", 32)))


def test_generation_runs_on_the_quantized_cache(lm):
    """Through kvviz.capture.loop: the trace's cache is the quantized one, and INT8 keeps greedy answers."""
    prompt = "What is the capital of France?"
    made = []

    def factory(model):
        made.append(cache_factory(kivi(2, 16, 16))(model))
        return made[-1]

    trace = capture(lm, prompt, max_new_tokens=3, cache_factory=factory)
    cache = made[0]
    assert isinstance(cache, QuantizedKVCache) and all(isinstance(x, QuantizedLayer) for x in cache.layers)
    n = trace.n_fed
    assert cache.layers[0].get_seq_length() == n
    assert cache.layers[0].quantized_keys == (n - 16) // 16 * 16
    shape = tuple(cache.layers[0].keys.shape)
    expected = len(cache.layers) * (
        stored_bytes(shape, cache.scheme.key).total + stored_bytes(shape, cache.scheme.value).total
    )
    assert cache.packed_bytes() == expected

    int8 = Scheme("INT8 per token", QuantSpec("int8", "token", 32), QuantSpec("int8", "token", 32))
    cmp = compare_generation(lm, prompt, int8, max_new_tokens=6)
    assert cmp.agreement == 1.0 and cmp.first_divergence is None
    assert cmp.quant_text == cmp.full_text and "Paris" in cmp.full_text
    assert cmp.mean_kl < 1e-2
    assert cmp.packed_bytes < cmp.full_cache_bytes
    rows = cmp.side_by_side()
    assert len(rows) == cmp.steps and all(r["same"] for r in rows)
