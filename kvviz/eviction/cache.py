"""A transformers Cache whose layers really drop entries, each KV head its own kept set.

``EvictingCache`` holds per layer ``keys``/``values`` [1, Hkv, n, D] and ``kv_positions`` [Hkv, n]
(the absolute position held in every slot; the Recorder reads it to map attention rows onto
positions). ``keep(positions)`` gathers the kept entries into new, smaller tensors, so the bytes
measured from the tensors shrink; while decoding, a policy that drops one entry per head reuses
the evicted slot for the next token instead (one spare slot, no copy of the whole cache). Masks are built in cache-slot space
(``get_seq_length`` = entries held), while RoPE uses the position ids the caller feeds: absolute
positions by default (kept keys keep their original rotation), or cache slots when a
:class:`KeyRerotator` re-rotates the kept keys to their new slots (StreamingLLM's re-positioning).

Ragged selections (PyramidKV's per-layer budgets, AdaKV's per-head ones) are stored per layer padded
to the layer's fullest head: a padding slot holds position ``PAD`` and is masked out of attention
(``valid`` per head and slot; the capture wrapper applies :meth:`EvictingCache.attention_override`),
so every layer's tensors shrink to its own budget and :meth:`EvictingCache.held_bytes` counts what a
store holding ragged heads would keep.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from kvviz.eviction.policies.base import PAD


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


_NO_POSITIONS = torch.empty(0, 0, dtype=torch.long)  # a layer before its first token


class EvictingLayer(DynamicLayer):
    """A DynamicLayer that also tracks absolute positions and can keep a per-head subset.

    Steady state of a policy that evicts one entry per head after every token (StreamingLLM, the
    window, H2O): the tensors have room for exactly ``n_kept + 1`` entries; the new token is written
    into the spare slot and the evicted entry's slot is refilled with it, so a step moves a few rows
    instead of copying (and re-allocating) the whole cache. Slots are then no longer in position
    order (``kv_positions`` says which position each slot holds; attention does not care).
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.kv_positions = _NO_POSITIONS  # [Hkv, n] absolute position held in each slot
        self.seen = 0  # tokens ever appended (the next token's absolute position)
        self._kbuf: torch.Tensor | None = None  # [1, Hkv, cap, D] storage behind keys/values when cap > n
        self._vbuf: torch.Tensor | None = None
        self._pbuf: torch.Tensor | None = None
        self._heads: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None  # [Hkv, n] False on padding slots of a ragged selection; None: all held

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
        kbuf, vbuf, pbuf = self._kbuf, self._vbuf, self._pbuf
        if kbuf is not None and vbuf is not None and pbuf is not None and n + q == kbuf.shape[2]:
            kbuf[:, :, n:] = key_states  # fill the spare slot in place
            vbuf[:, :, n:] = value_states
            pbuf[:, n:] = new
            self.keys, self.values, self.kv_positions = kbuf, vbuf, pbuf
            return kbuf, vbuf
        self._kbuf = self._vbuf = self._pbuf = None
        self.kv_positions = torch.cat([self.kv_positions, new], dim=-1)
        if self.valid is not None:
            self.valid = torch.cat([self.valid, self.valid.new_ones(hkv, q)], dim=-1)
        return super().update(key_states, value_states, *args, **kwargs)

    def keep_slots(
        self, slots: torch.Tensor, rerotator: KeyRerotator | None = None, valid: torch.Tensor | None = None
    ) -> None:
        """Keep the entries at ``slots`` [Hkv, k] in that order; the rest is freed (new, smaller tensors).

        ``valid`` [Hkv, k]: False marks padding slots (a head keeping fewer entries than the layer's
        fullest): their position becomes PAD and attention never reads them.
        """
        keys, values = self.stored()
        hkv, k = slots.shape
        d, n = keys.shape[-1], keys.shape[2]
        flat = (slots.to(keys.device) + torch.arange(hkv, device=keys.device)[:, None] * n).reshape(-1)
        keys = keys.reshape(hkv * n, d).index_select(0, flat).view(1, hkv, k, d)  # [1, Hkv, k, D]
        self.values = values.reshape(hkv * n, d).index_select(0, flat).view(1, hkv, k, d)
        self.kv_positions = self.kv_positions.gather(1, slots.to(self.kv_positions.device))
        self.valid = None if valid is None or bool(valid.all()) else valid.to(self.kv_positions.device)
        if self.valid is not None:
            if rerotator is not None:
                raise ValueError("Re-positioning keys and ragged selections do not combine.")
            self.kv_positions = self.kv_positions.masked_fill(~self.valid, PAD)
        if rerotator is not None:  # keys were rotated at their old slot; move them to slot 0..k-1
            delta = torch.arange(k, device=slots.device).expand(hkv, k) - slots
            keys = rerotator.rotate(keys, delta)
        self.keys = keys
        self._kbuf = self._vbuf = self._pbuf = None

    def held(self) -> int:
        """Entries held over all heads (padding slots excluded)."""
        if not self.is_initialized:
            return 0
        return int(self.valid.sum()) if self.valid is not None else self.kv_positions.numel()

    def refill_evicted(self, evicted: torch.Tensor) -> None:
        """Drop one entry per head, ``evicted`` [Hkv] slots, by moving the last slot's entry into it.

        The tensors keep their size (one spare slot for the next token); ``keys``/``values`` become
        views of the first n − 1 slots.
        """
        if self.valid is not None:
            raise ValueError("A ragged cache layer does not evict while decoding.")
        kbuf, vbuf = self.stored()
        pbuf = self.kv_positions
        hkv, n = pbuf.shape
        if self._heads is None or self._heads.numel() != hkv:
            self._heads = torch.arange(hkv, device=kbuf.device)  # made once: used at every step
        heads = self._heads
        ev = evicted.to(kbuf.device)
        kbuf[0, heads, ev] = kbuf[0, :, n - 1]
        vbuf[0, heads, ev] = vbuf[0, :, n - 1]
        pbuf[heads, ev] = pbuf[:, n - 1]
        self._kbuf, self._vbuf, self._pbuf = kbuf, vbuf, pbuf
        self.keys, self.values = kbuf[:, :, : n - 1], vbuf[:, :, : n - 1]
        self.kv_positions = pbuf[:, : n - 1]

    def stored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The held keys and values ([1, Hkv, n, D] each); an error before the first token arrived."""
        if self.keys is None or self.values is None:
            raise RuntimeError("The evicting cache layer holds no entries yet.")
        return self.keys, self.values

    def reset(self) -> None:
        super().reset()
        self.kv_positions, self.seen, self.valid = _NO_POSITIONS, 0, None
        self._kbuf = self._vbuf = self._pbuf = None

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("An evicting cache cannot be cropped: its slots are not in position order.")


def _check_full_attention(config) -> int:
    """Layers of a model whose every layer caches full attention (read by the one config reader), else ValueError."""
    from kvviz.memory.layout import cache_layout

    kinds = cache_layout(config).kinds
    if any(k != "full" for k in kinds):
        raise ValueError(
            "Eviction supports models whose layers all use full attention; this model has "
            f"{', '.join(sorted(set(kinds)))} layers."
        )
    return len(kinds)


class EvictingCache(Cache):
    """One :class:`EvictingLayer` per layer; ``keep`` applies a policy's decision to every layer."""

    def __init__(self, config, rerotator: KeyRerotator | None = None, reuse_slots: bool = True):
        self.evicting_layers = [EvictingLayer() for _ in range(_check_full_attention(config))]
        super().__init__(layers=list(self.evicting_layers))
        self.rerotator = rerotator
        self.reuse_slots = reuse_slots  # False: always gather into new tensors (the reference path)

    def load(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> EvictingCache:
        """Start from a prefill computed elsewhere: per layer keys/values [Hkv, n, D] at positions 0 … n − 1."""
        for layer, k, v in zip(self.evicting_layers, keys, values, strict=True):
            layer.lazy_initialization(k[None], v[None])
            layer.keys, layer.values = k[None], v[None]
            layer.kv_positions = torch.arange(k.shape[1], device=k.device).expand(k.shape[0], -1)
            layer.seen = k.shape[1]
        return self

    @property
    def repositions(self) -> bool:
        """True when RoPE positions are cache slots (feed position ids = ``get_seq_length()``)."""
        return self.rerotator is not None

    @property
    def ragged(self) -> bool:
        """True when heads or layers hold different numbers of entries (padding slots are masked)."""
        lengths = {layer.kv_positions.shape[-1] for layer in self.evicting_layers if layer.is_initialized}
        return len(lengths) > 1 or any(layer.valid is not None for layer in self.evicting_layers)

    def positions(self) -> torch.Tensor:
        """Absolute positions held, in slot order: [Lyr, Hkv, n]; a ragged cache pads with PAD to its longest layer."""
        held = [layer.kv_positions for layer in self.evicting_layers]
        n = max(p.shape[-1] for p in held)
        return torch.stack([torch.nn.functional.pad(p, (0, n - p.shape[-1]), value=PAD) for p in held])

    def keep(
        self, positions: torch.Tensor, held: torch.Tensor | None = None, order: torch.Tensor | None = None
    ) -> None:
        """Keep the absolute ``positions`` [Lyr, Hkv, k]; anything not held is an error.

        One entry fewer per head than held (a decode step of StreamingLLM, the window or H2O) takes
        the in-place path; otherwise the kept entries are gathered, in the order given, into new tensors.
        ``held``/``order``: ``positions()`` and its argsort, if the caller has them already.
        """
        held = self.positions() if held is None else held
        if bool((positions == PAD).any()) or self.ragged:
            self._keep_ragged(positions)
            return
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
            for layer, s in zip(self.evicting_layers, slots):
                layer.refill_evicted(s)
            return
        idx = torch.searchsorted(ordered, positions).clamp(max=n - 1)
        if not torch.equal(ordered.gather(-1, idx), positions):
            raise ValueError(
                "The selection keeps positions the cache no longer holds (evicted entries never come back)."
            )
        slots = order.gather(-1, idx)
        for layer, s in zip(self.evicting_layers, slots):
            layer.keep_slots(s, self.rerotator)

    def _keep_ragged(self, positions: torch.Tensor) -> None:
        """A selection with PAD entries (or a cache already ragged): each layer gathers its heads' kept
        entries into tensors as long as its fullest head, padding slots masked."""
        if positions.shape[:2] != (len(self.evicting_layers), self.evicting_layers[0].kv_positions.shape[0]):
            raise ValueError(f"Selection shape {tuple(positions.shape)} does not match the cache's layers and heads.")
        for layer, want in zip(self.evicting_layers, positions.to(self.evicting_layers[0].kv_positions.device)):
            valid = want != PAD  # [Hkv, k]
            k = int(valid.sum(-1).max())
            want, valid = want[:, :k], valid[:, :k]
            held = layer.kv_positions
            order = held.masked_fill(held == PAD, torch.iinfo(held.dtype).max).argsort(dim=-1)
            ordered = held.gather(-1, order)
            idx = torch.searchsorted(ordered, want.clamp(min=0)).clamp(max=held.shape[-1] - 1)
            found = ordered.gather(-1, idx) == want
            if not bool(found[valid].all()):
                raise ValueError(
                    "The selection keeps positions the cache no longer holds (evicted entries never come back)."
                )
            layer.keep_slots(torch.where(valid, order.gather(-1, idx), 0), self.rerotator, valid)

    def held_bytes(self) -> int:
        """Bytes of the entries held, padding slots excluded: what a store holding ragged heads keeps."""
        total = 0
        for layer in self.evicting_layers:
            if layer.keys is not None and layer.values is not None and layer.keys.numel():
                per_entry = (
                    layer.keys.shape[-1] * layer.keys.element_size()
                    + layer.values.shape[-1] * layer.values.element_size()
                )
                total += layer.held() * per_entry
        return int(total)

    def attention_mask(self, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        """Additive mask [1, Hq, q, n] for a ragged cache: padding slots masked, the q newest entries causal."""
        layer = self.evicting_layers[layer_idx]
        hkv, n = layer.kv_positions.shape
        q = query.shape[2]
        valid = layer.valid if layer.valid is not None else torch.ones(hkv, n, dtype=torch.bool, device=query.device)
        allowed = valid.to(query.device)[:, None, :].expand(hkv, q, n)  # [Hkv, q, n]
        if q > 1:
            slot, row = torch.arange(n, device=query.device), torch.arange(q, device=query.device)
            allowed = allowed & (slot[None, :] <= n - q + row[:, None])
        allowed = allowed.repeat_interleave(query.shape[1] // hkv, dim=0)[None]  # [1, Hq, q, n]
        mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        return mask.masked_fill(~allowed, torch.finfo(query.dtype).min)

    def attention_override(self, module, query, key, value, attention_mask, implementation, *args, **kwargs):
        """The model's own attention with :meth:`attention_mask` in place of the model's mask (ragged caches)."""
        return implementation(module, query, key, value, self.attention_mask(module.layer_idx, query), *args, **kwargs)

    def forward_kwargs(self) -> dict:
        """Extra forward arguments this cache needs: the attention override once it is ragged."""
        from kvviz.capture.attention_fn import OVERRIDE_KWARG

        return {OVERRIDE_KWARG: self.attention_override} if self.ragged else {}

    def nbytes(self) -> int:
        """Bytes of the stored key and value tensors (measured, not a formula)."""
        total = 0
        for layer in self.evicting_layers:
            if layer.keys is not None and layer.values is not None and layer.keys.numel():
                total += (
                    layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
                )
        return int(total)


class StreamingCache(EvictingCache):
    """Attention sinks + a recent window, fed in chunks as if token by token.

    Holds the first ``sinks`` positions and the latest ``recent`` ones (:meth:`trim`, between
    forwards), and masks a forward of several queries so that each sees exactly the keys a
    token-by-token streaming cache would hold when it came, plus itself (original positions)."""

    def __init__(self, config, sinks: int, recent: int):
        super().__init__(config)
        self.sinks, self.recent = sinks, recent

    def trim(self) -> None:
        """Keep the sinks and the ``recent`` positions before the next one."""
        held = self.positions()  # [Lyr, Hkv, n], the same positions everywhere
        pos = held[0, 0]
        keep = torch.cat([pos[pos < self.sinks], pos[pos > pos.max() - self.recent]])
        self.keep(keep.expand(*held.shape[:2], keep.shape[-1]).contiguous(), held=held)

    def attention_mask(self, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        """Additive mask [1, 1, q, n]: query at position p sees keys ≤ p that are sinks or within ``recent`` of p."""
        kpos = self.evicting_layers[layer_idx].kv_positions[0].to(query.device)  # [n]; the q queries are the newest
        qpos = kpos[-query.shape[2] :, None]  # [q, 1]
        allowed = (kpos <= qpos) & ((kpos < self.sinks) | (kpos >= qpos - self.recent))  # [q, n]
        mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        return mask.masked_fill(~allowed, torch.finfo(query.dtype).min)[None, None]

    def forward_kwargs(self) -> dict:
        from kvviz.capture.attention_fn import OVERRIDE_KWARG

        return {OVERRIDE_KWARG: self.attention_override}
