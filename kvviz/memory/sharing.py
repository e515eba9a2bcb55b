"""Cross-layer KV sharing on a whole layout: undo it, or impose it on any model (the calculator's field).

``share_kv(layout, 16)`` keeps the first 16 layers storing K/V and makes each later one read the last
producing layer of its type, as Gemma-4 shares; ``unshared(layout)`` gives every layer its own K/V again,
the counterfactual the comparison table prints beside a sharing model::

    from kvviz.memory.layout import cache_layout
    estimate(share_kv(cache_layout("Llama-3-8B"), 16), 8192).bytes_per_sequence   # half the unshared
"""

from __future__ import annotations

from dataclasses import replace

from kvviz.memory.layer_rules import producers_from_count
from kvviz.memory.layout import CacheLayout


def unshared(layout: CacheLayout) -> CacheLayout:
    """The same model with every layer storing its own K/V (each shared layer a copy of its source)."""
    layers = []
    for layer in layout.layers:
        if layer.kv_source is not None:
            src = layout.layers[layer.kv_source]
            layer = replace(layer, kind=src.kind, vectors=src.vectors, kv_heads=src.kv_heads, kv_source=None)
        layers.append(layer)
    return replace(layout, layers=tuple(layers))


def share_kv(layout: CacheLayout, producing: int) -> CacheLayout:
    """``layout`` with only its first ``producing`` layers storing K/V, the rest sharing as Gemma shares.

    The calculator's "KV-producing layers" field: sizes any model as if it had been built with
    cross-layer sharing (the layers' shapes stay the config's; only who stores K/V changes).
    """
    base = unshared(layout)
    sources = producers_from_count([layer.layer_type if layer.vectors else None for layer in base.layers], producing)
    layers = tuple(
        replace(layer, kind="shared", vectors=(), kv_heads=0, kv_source=s) if s != i else layer
        for i, (layer, s) in enumerate(zip(base.layers, sources))
    )
    own = sum(1 for layer in layers if layer.vectors)
    note = (
        f"KV-producing layers set to {producing}: {own} layers store K/V, {len(layers) - own} reuse an earlier layer's"
    )
    return replace(base, layers=layers, notes=(*layout.notes, note))
