"""The held entries of an evicting cache as served: quantized under a scheme, and their bytes.

:func:`quantize_kept` stores a policy's kept entries under a quantization scheme (``run_policy(quant=...)``,
right after the prefill); :func:`served_bytes` counts what they take as served. Both the run
(:mod:`kvviz.eviction.run`) and the side-by-side measure (:mod:`kvviz.eviction.compose`) call them.
"""

from __future__ import annotations

from kvviz.eviction.cache import EvictingCache
from kvviz.quant.schemes import FULL_BYTES, Scheme, simulate, stored_bytes


def quantize_kept(cache: EvictingCache, scheme: Scheme) -> None:
    """Replace every layer's held keys and values [1, Hkv, k, D] by what a cache stored under ``scheme`` returns
    (oldest entries quantized, the spec's recent window exact; slots are in position order after a gather)."""
    for layer in cache.evicting_layers:
        keys, values = layer.stored()
        layer.keys = simulate(keys, scheme.key).to(keys.dtype)
        layer.values = simulate(values, scheme.value).to(values.dtype)


def served_bytes(cache: EvictingCache, scheme: Scheme | None) -> int:
    """Bytes of the held entries as served: 16-bit, or packed under ``scheme`` (per KV head, padding excluded)."""
    total = 0
    for layer in cache.evicting_layers:
        keys, _ = layer.stored()
        d = keys.shape[-1]
        counts = layer.valid.sum(-1).tolist() if layer.valid is not None else [keys.shape[2]] * keys.shape[1]
        for k in counts:
            if scheme is None:
                total += 2 * k * d * FULL_BYTES
            else:
                total += stored_bytes((1, k, d), scheme.key).total + stored_bytes((1, k, d), scheme.value).total
    return total
