"""A transformers Cache whose layers really drop entries, each KV head its own kept set.

``EvictingCache`` holds per layer ``keys``/``values`` [1, Hkv, n, D] and ``kv_positions`` [Hkv, n]
(the absolute position held in every slot; the Recorder reads it to map attention rows onto
positions). ``keep(positions)`` gathers the kept entries into new, smaller tensors, so the bytes
measured from the tensors shrink; while decoding, a policy that drops one entry per head reuses
the evicted slot for the next token instead (one spare slot, no copy of the whole cache). Masks are built in cache-slot space
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
    """A DynamicLayer that also tracks absolute positions and can keep a per-head subset.

    Steady state of a policy that evicts one entry per head after every token (StreamingLLM, the
    window, H2O): the tensors have room for exactly ``n_kept + 1`` entries; the new token is written
    into the spare slot and the evicted entry's slot is refilled with it, so a step moves a few rows
    instead of copying (and re-allocating) the whole cache. Slots are then no longer in position
    order (``kv_positions`` says which position each slot holds; attention does not care).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kv_positions: torch.Tensor | None = None  # [Hkv, n] absolute position held in each slot
        self.seen = 0  # tokens ever appended (the next token's absolute position)
        self._kbuf: torch.Tensor | None = None  # [1, Hkv, cap, D] storage behind keys/values when cap > n
        self._vbuf: torch.Tensor | None = None
        self._pbuf: torch.Tensor | None = None
        self._heads: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.kv_positions = torch.empty(key_states.shape[1], 0, dtype=torch.long, device=key_states.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if key_states.shape[0] != 1:
            raise ValueError("The evicting cache holds one sequence (batch size 1).")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        hkv, q = key_states.shape[1], key_states.shape[2]
        n = self.kv_positions.shape[-1]
        new = torch.arange(self.seen, self.seen + q, device=self.kv_positions.device).expand(hkv, q)
        self.seen += q
        if self._kbuf is not None and n + q == self._kbuf.shape[2]:  # fill the spare slot in place
            self._kbuf[:, :, n:] = key_states
            self._vbuf[:, :, n:] = value_states
            self._pbuf[:, n:] = new
            self.keys, self.values, self.kv_positions = self._kbuf, self._vbuf, self._pbuf
            return self.keys, self.values
        self._kbuf = self._vbuf = self._pbuf = None
        self.kv_positions = torch.cat([self.kv_positions, new], dim=-1)
        return super().update(key_states, value_states, *args, **kwargs)

    def keep_slots(self, slots: torch.Tensor, rerotator: KeyRerotator | None = None) -> None:
        """Keep the entries at ``slots`` [Hkv, k] in that order; the rest is freed (new, smaller tensors)."""
        hkv, k = slots.shape
        d = self.keys.shape[-1]
        n = self.keys.shape[2]
        flat = (slots.to(self.keys.device) + torch.arange(hkv, device=self.keys.device)[:, None] * n).reshape(-1)
        keys = self.keys.reshape(hkv * n, d).index_select(0, flat).view(1, hkv, k, d)  # [1, Hkv, k, D]
        self.values = self.values.reshape(hkv * n, d).index_select(0, flat).view(1, hkv, k, d)
        self.kv_positions = self.kv_positions.gather(1, slots.to(self.kv_positions.device))
        if rerotator is not None:  # keys were rotated at their old slot; move them to slot 0..k-1
            delta = torch.arange(k, device=slots.device).expand(hkv, k) - slots
            keys = rerotator.rotate(keys, delta)
        self.keys = keys
        self._kbuf = self._vbuf = self._pbuf = None

    def refill_evicted(self, evicted: torch.Tensor) -> None:
        """Drop one entry per head, ``evicted`` [Hkv] slots, by moving the last slot's entry into it.

        The tensors keep their size (one spare slot for the next token); ``keys``/``values`` become
        views of the first n − 1 slots.
        """
        hkv, n = self.kv_positions.shape
        if self._heads is None or self._heads.numel() != hkv:
            self._heads = torch.arange(hkv, device=self.keys.device)  # made once: used at every step
        heads = self._heads
        ev = evicted.to(self.keys.device)
        self._kbuf, self._vbuf, self._pbuf = self.keys, self.values, self.kv_positions
        self._kbuf[0, heads, ev] = self._kbuf[0, :, n - 1]
        self._vbuf[0, heads, ev] = self._vbuf[0, :, n - 1]
        self._pbuf[heads, ev] = self._pbuf[:, n - 1]
        self.keys, self.values = self._kbuf[:, :, : n - 1], self._vbuf[:, :, : n - 1]
        self.kv_positions = self._pbuf[:, : n - 1]

    def reset(self) -> None:
        super().reset()
        self.kv_positions, self.seen = None, 0
        self._kbuf = self._vbuf = self._pbuf = None

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("An evicting cache cannot be cropped: its slots are not in position order.")


def _check_full_attention(config) -> int:
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kinds = list(getattr(cfg, "layer_types", None) or [])
    if not kinds:
        kinds = ["sliding_attention" if getattr(cfg, "sliding_window", None) else "full_attention"]
    if any(k != "full_attention" for k in kinds):
        raise ValueError(
            "Eviction supports models whose layers all use full attention; this model has "
            f"{', '.join(sorted(set(kinds)))} layers."
        )
    return int(getattr(cfg, "num_hidden_layers", None) or cfg.n_layer)


class EvictingCache(Cache):
    """One :class:`EvictingLayer` per layer; ``keep`` applies a policy's decision to every layer."""

    def __init__(self, config, rerotator: KeyRerotator | None = None, reuse_slots: bool = True):
        layers = _check_full_attention(config)
        super().__init__(layers=[EvictingLayer() for _ in range(layers)])
        self.rerotator = rerotator
        self.reuse_slots = reuse_slots  # False: always gather into new tensors (the reference path)

    @property
    def repositions(self) -> bool:
        """True when RoPE positions are cache slots (feed position ids = ``get_seq_length()``)."""
        return self.rerotator is not None

    def positions(self) -> torch.Tensor:
        """Absolute positions held, in slot order: [Lyr, Hkv, n] (every layer holds as many entries)."""
        return torch.stack([layer.kv_positions for layer in self.layers])

    def keep(
        self, positions: torch.Tensor, held: torch.Tensor | None = None, order: torch.Tensor | None = None
    ) -> None:
        """Keep the absolute ``positions`` [Lyr, Hkv, k]; anything not held is an error.

        One entry fewer per head than held (a decode step of StreamingLLM, the window or H2O) takes
        the in-place path; otherwise the kept entries are gathered, in the order given, into new tensors.
        ``held``/``order``: ``positions()`` and its argsort, if the caller has them already.
        """
        held = self.positions() if held is None else held
        if positions.shape[:2] != held.shape[:2]:
            raise ValueError(f"Selection shape {tuple(positions.shape)} does not match the cache {tuple(held.shape)}.")
        positions = positions.to(held.device)
        order = held.argsort(dim=-1) if order is None else order  # slots are in position order only after a gather
        ordered = held.gather(-1, order)
        k, n = positions.shape[-1], held.shape[-1]
        if k == n - 1 and self.rerotator is None and self.reuse_slots:
            evicted = ordered.sum(-1) - positions.sum(-1)  # [Lyr, Hkv]: the one position not kept
            rest = ordered.masked_select(ordered != evicted[..., None])
            same = rest.numel() == positions.numel() and (
                torch.equal(rest.view_as(positions), positions)
                or torch.equal(rest.view_as(positions), positions.sort(-1).values)
            )
            if not same:
                raise ValueError(
                    "The selection keeps positions the cache no longer holds (evicted entries never come back)."
                )
            slots = (held == evicted[..., None]).int().argmax(-1)  # [Lyr, Hkv]
            for layer, s in zip(self.layers, slots):
                layer.refill_evicted(s)
            return
        idx = torch.searchsorted(ordered, positions).clamp(max=n - 1)
        if not torch.equal(ordered.gather(-1, idx), positions):
            raise ValueError(
                "The selection keeps positions the cache no longer holds (evicted entries never come back)."
            )
        slots = order.gather(-1, idx)
        for layer, s in zip(self.layers, slots):
            layer.keep_slots(s, self.rerotator)

    def nbytes(self) -> int:
        """Bytes of the stored key and value tensors (measured, not a formula)."""
        total = 0
        for layer in self.layers:
            if layer.keys is not None and layer.keys.numel():
                total += (
                    layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
                )
        return int(total)
