"""A transformers Cache whose layers really drop entries, each KV head its own kept set.

``EvictingCache`` holds per layer ``keys``/``values`` [1, Hkv, n, D] and ``kv_positions`` [Hkv, n]
(the absolute position of every held entry, ascending per head; the Recorder reads it to map
attention rows onto positions). ``keep(positions)`` gathers the kept entries into new, smaller
tensors, so the bytes measured from the tensors shrink. Masks are built in cache-slot space
(``get_seq_length`` = entries held), while RoPE uses the position ids the caller feeds: absolute
positions by default (kept keys keep their original rotation), or cache slots when a
:class:`KeyRerotator` re-rotates the kept keys to their new slots (StreamingLLM's re-positioning).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class KeyRerotator:
    """Re-rotates RoPE keys by a position offset: R(Δ)·R(p)·k = R(p + Δ)·k (plain RoPE only)."""

    def __init__(self, inv_freq: torch.Tensor):
        self.inv_freq = inv_freq.float()  # [D/2]

    @classmethod
    def from_model(cls, model) -> KeyRerotator:
        """Find the model's rotary embedding; refuse scaled variants whose rotations do not compose."""
        for module in model.modules():
            inv = getattr(module, "inv_freq", None)
            if isinstance(inv, torch.Tensor):
                if float(getattr(module, "attention_scaling", 1.0)) != 1.0:
                    raise ValueError("Re-positioning needs plain RoPE; this model scales its rotary embedding.")
                return cls(inv)
        raise ValueError("Re-positioning needs a RoPE model; no rotary embedding found.")

    def rotate(self, keys: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """keys [1, Hkv, k, D] rotated by delta [Hkv, k] positions."""
        angle = delta.to(self.inv_freq.device).float()[..., None] * self.inv_freq  # [Hkv, k, D/2]
        angle = torch.cat([angle, angle], dim=-1)[None].to(keys.device)  # [1, Hkv, k, D]
        half = keys.shape[-1] // 2
        rotated_half = torch.cat([-keys[..., half:], keys[..., :half]], dim=-1)
        return (keys.float() * angle.cos() + rotated_half.float() * angle.sin()).to(keys.dtype)


class EvictingLayer(DynamicLayer):
    """A DynamicLayer that also tracks absolute positions and can keep a per-head subset."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kv_positions: torch.Tensor | None = None  # [Hkv, n] absolute positions held
        self.seen = 0  # tokens ever appended (the next token's absolute position)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.kv_positions = torch.empty(key_states.shape[1], 0, dtype=torch.long, device=key_states.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if key_states.shape[0] != 1:
            raise ValueError("The evicting cache holds one sequence (batch size 1).")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        hkv, q = key_states.shape[1], key_states.shape[2]
        new = torch.arange(self.seen, self.seen + q, device=self.kv_positions.device).expand(hkv, q)
        self.kv_positions = torch.cat([self.kv_positions, new], dim=-1)
        self.seen += q
        return super().update(key_states, value_states, *args, **kwargs)

    def keep_slots(self, slots: torch.Tensor, rerotator: KeyRerotator | None = None) -> None:
        """Keep the entries at ``slots`` [Hkv, k] (ascending per head); the rest is freed."""
        hkv, k = slots.shape
        idx = slots.to(self.keys.device)[None, :, :, None].expand(1, hkv, k, self.keys.shape[-1])
        keys = self.keys.gather(2, idx)  # [1, Hkv, k, D]: new tensors, the old ones are released
        self.values = self.values.gather(2, idx)
        self.kv_positions = self.kv_positions.gather(1, slots.to(self.kv_positions.device))
        if rerotator is not None:  # keys were rotated at their old slot; move them to slot 0..k-1
            delta = torch.arange(k, device=slots.device).expand(hkv, k) - slots
            keys = rerotator.rotate(keys, delta)
        self.keys = keys

    def reset(self) -> None:
        super().reset()
        self.kv_positions, self.seen = None, 0

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if tokens_to_remove < 0 and self.kv_positions is not None:
            self.kv_positions = self.kv_positions[:, :tokens_to_remove]
            self.seen += tokens_to_remove


def _check_full_attention(config) -> int:
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kinds = list(getattr(cfg, "layer_types", None) or [])
    if not kinds:
        kinds = ["sliding_attention" if getattr(cfg, "sliding_window", None) else "full_attention"]
    if any(k != "full_attention" for k in kinds):
        raise ValueError("Eviction supports models whose layers all use full attention; this model has "
                         f"{', '.join(sorted(set(kinds)))} layers.")
    return int(getattr(cfg, "num_hidden_layers", None) or cfg.n_layer)


class EvictingCache(Cache):
    """One :class:`EvictingLayer` per layer; ``keep`` applies a policy's decision to every layer."""

    def __init__(self, config, rerotator: KeyRerotator | None = None):
        layers = _check_full_attention(config)
        super().__init__(layers=[EvictingLayer() for _ in range(layers)])
        self.rerotator = rerotator

    @property
    def repositions(self) -> bool:
        """True when RoPE positions are cache slots (feed position ids = ``get_seq_length()``)."""
        return self.rerotator is not None

    def positions(self) -> torch.Tensor:
        """Absolute positions held: [Lyr, Hkv, n] (every layer holds the same number of entries)."""
        return torch.stack([layer.kv_positions for layer in self.layers])

    def keep(self, positions: torch.Tensor) -> None:
        """Keep the absolute ``positions`` [Lyr, Hkv, k] (ascending); anything not held is an error."""
        held = self.positions()
        if positions.shape[:2] != held.shape[:2]:
            raise ValueError(f"Selection shape {tuple(positions.shape)} does not match the cache {tuple(held.shape)}.")
        positions = positions.to(held.device)
        slots = torch.searchsorted(held, positions).clamp(max=held.shape[-1] - 1)
        if not torch.equal(held.gather(-1, slots), positions):
            raise ValueError("The selection keeps positions the cache no longer holds (evicted entries never come back).")
        for layer, s in zip(self.layers, slots):
            layer.keep_slots(s, self.rerotator)

    def nbytes(self) -> int:
        """Bytes of the stored key and value tensors (measured, not a formula)."""
        total = 0
        for layer in self.layers:
            if layer.keys is not None and layer.keys.numel():
                total += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
        return int(total)
