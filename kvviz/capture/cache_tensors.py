"""Every tensor a transformers cache stores, layer by layer, with its bytes (read from the tensors, never a formula).

A cache layer may hold keys and values (or MLA's latent and RoPE key), a sparse-attention indexer's keys
(``DynamicIndexedLayer.indexer_keys``, DeepSeek-V3.2), a linear-attention layer's fixed conv and recurrent
states (``LinearAttentionLayer.conv_states`` / ``recurrent_states``, Qwen3-Next's gated DeltaNet), or
nothing at all (``DummyLayer``: a layer that reads an earlier layer's K/V under cross-layer sharing)::

    tensors = stored_tensors(cache, cache_layout(model.config))
    sum(t.bytes for t in tensors if t.part == "state")   # the same after 10 tokens as after 10,000
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.memory.layout import CacheLayout


@dataclass(frozen=True)
class CacheTensor:
    """One tensor a cache layer holds: what it is, its shape and its bytes."""

    layer: int
    layer_kind: str  # the memory calculator's kind: "full", "sliding", "mla", "shared", "state", ...
    name: str  # "keys", "values", MLA's "latent" / "RoPE key", "indexer keys", "conv state", "recurrent state"
    shape: tuple[int, ...]  # [batch, heads, tokens, dim] for K/V; the state's own shape otherwise
    dtype: str
    bytes: int

    @property
    def part(self) -> str:
        """ "kv" for what grows with the tokens (keys, values, latent, indexer keys), "state" for fixed states."""
        return "state" if self.name.endswith("state") else "kv"


def _named(layer, kv_names: tuple[str, str]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of everything one cache layer stores."""
    out = []
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.numel():
        out += [(kv_names[0], keys), (kv_names[1], values)]
    index = getattr(layer, "indexer_keys", None)
    if isinstance(index, torch.Tensor) and index.numel():
        out.append(("indexer keys", index))
    for attr, name in (("conv_states", "conv state"), ("recurrent_states", "recurrent state")):
        states = getattr(layer, attr, None)
        if isinstance(states, dict):
            out += [(name, t) for t in states.values() if isinstance(t, torch.Tensor)]
    return out


def stored_tensors(cache, layout: CacheLayout) -> tuple[CacheTensor, ...]:
    """Every tensor of every layer of ``cache``, labelled with the calculator's kind of that layer."""
    names = ("latent", "RoPE key") if layout.mla else ("keys", "values")
    return tuple(
        CacheTensor(
            spec.index,
            spec.kind,
            name,
            tuple(t.shape),
            str(t.dtype).removeprefix("torch."),
            t.numel() * t.element_size(),
        )
        for spec, layer in zip(layout.layers, cache.layers)
        for name, t in _named(layer, names)
    )


def bytes_per_layer(tensors: tuple[CacheTensor, ...], layers: int, part: str) -> tuple[int, ...]:
    """Per layer, the bytes of its ``part`` ("kv" or "state") tensors."""
    return tuple(sum(t.bytes for t in tensors if t.layer == i and t.part == part) for i in range(layers))
