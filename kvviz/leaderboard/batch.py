"""Many compressed caches decoded as one batch over one shared prefill: how the sweep reuses its prefill.

Every cell of the sweep (a policy at a ratio, query-aware or not) keeps a subset of the same
prefill's entries. Instead of copying the prefill per cell, :class:`SharedPrefixCache` holds the
prefill's keys and values once ([Hkv, S, D] per layer) and, per batch row, which of them the row
keeps (``keep`` [B, Hkv, S]) plus the row's own new entries ([B, Hkv, t, D], with ``valid`` [B, t]
for rows that fed fewer tokens). Attention (:meth:`SharedPrefixCache.attend`, run through the
capture wrapper's override) scores each row's query against the shared keys with one GEMM per KV
head and masks what the row does not keep — exactly softmax attention over the row's kept entries
plus its new ones, so a row decodes as its own evicted cache would (a test checks it against
:func:`kvviz.eviction.run.run_policy`).
"""

from __future__ import annotations

import math

import torch
from transformers.cache_utils import Cache, DynamicLayer


class SharedPrefixLayer(DynamicLayer):
    """One layer: the shared prefill ([Hkv, S, D]), each row's kept mask, and each row's new entries."""

    def __init__(self, prefix_keys: torch.Tensor, prefix_values: torch.Tensor, keep: torch.Tensor):
        super().__init__()
        self.prefix_keys, self.prefix_values = prefix_keys, prefix_values  # [Hkv, S, D]
        self.keep = keep  # [B, Hkv, S] bool
        b, hkv, _ = keep.shape
        d = prefix_keys.shape[-1]
        empty = prefix_keys.new_zeros(b, hkv, 0, d)
        self.lazy_initialization(empty, empty)
        self.keys, self.values = empty, empty.clone()  # [B, Hkv, t, D]: each row's new entries
        self.valid = torch.ones(b, 0, dtype=torch.bool, device=keep.device)  # [B, t] new entries each row holds

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = self.new_entries()
        self.valid = torch.cat([self.valid, self.valid.new_ones(key_states.shape[0], key_states.shape[2])], dim=1)
        self.keys = torch.cat([keys, key_states], dim=-2)
        self.values = torch.cat([values, value_states], dim=-2)
        return self.keys, self.values

    def new_entries(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's new keys and values [B, Hkv, t, D] (set from the start: t = 0 before the first token)."""
        if self.keys is None or self.values is None:
            raise RuntimeError("The shared-prefix layer was reset.")
        return self.keys, self.values

    def rows(self, index: torch.Tensor) -> None:
        """Keep only batch rows ``index`` (in that order; a row may repeat: a fork)."""
        keys, values = self.new_entries()
        self.keep, self.valid = self.keep[index], self.valid[index]
        self.keys, self.values = keys[index], values[index]

    def held(self) -> torch.Tensor:
        """Entries each row attends to, per KV head: [B, Hkv]."""
        return self.keep.sum(-1) + self.valid.sum(-1, keepdim=True)


class SharedPrefixCache(Cache):
    """One :class:`SharedPrefixLayer` per layer; pass ``forward_kwargs()`` to the model (under the capture wrapper)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], keep: torch.Tensor):
        """``keys``/``values``: per layer [Hkv, S, D]; ``keep`` [B, Lyr, Hkv, S] bool, what each row keeps."""
        self.shared_layers = [SharedPrefixLayer(k, v, keep[:, i]) for i, (k, v) in enumerate(zip(keys, values))]
        super().__init__(layers=list(self.shared_layers))

    @property
    def batch(self) -> int:
        return self.shared_layers[0].keep.shape[0]

    def rows(self, index: torch.Tensor | list[int]) -> None:
        index = torch.as_tensor(index, dtype=torch.long)
        for layer in self.shared_layers:
            layer.rows(index)

    def pad_front(self, n: int) -> None:
        """Give every row ``n`` empty new slots (masked) in front, to line up with rows that fed ``n`` more tokens."""
        for layer in self.shared_layers:
            keys, values = layer.new_entries()
            b, hkv, _, d = keys.shape
            layer.keys = torch.cat([keys.new_zeros(b, hkv, n, d), keys], dim=2)
            layer.values = torch.cat([values.new_zeros(b, hkv, n, d), values], dim=2)
            layer.valid = torch.cat([layer.valid.new_zeros(b, n), layer.valid], dim=1)

    def extend(self, other: SharedPrefixCache) -> None:
        """Append ``other``'s rows (same prefill, same number of new slots) after this cache's rows."""
        for a, b in zip(self.shared_layers, other.shared_layers):
            (ak, av), (bk, bv) = a.new_entries(), b.new_entries()
            if ak.shape[2] != bk.shape[2]:
                raise ValueError("Rows with different numbers of new slots: pad_front the shorter first.")
            a.keep, a.valid = torch.cat([a.keep, b.keep]), torch.cat([a.valid, b.valid])
            a.keys, a.values = torch.cat([ak, bk]), torch.cat([av, bv])

    def attend(self, module, query, key, value, attention_mask, implementation, *args, **kwargs):
        """Softmax attention of each row over its kept prefill entries and its valid new ones (causal among the
        q newest). query [B, Hq, q, D]; key/value: the rows' new entries [B, Hkv, t, D]. Returns ([B, q, Hq, D], None).

        Scores live in one buffer laid out [Hkv, B, g·q, S + t] so that the shared-prefix products are one GEMM
        per KV head in and out, with no copy of the prefill per row.
        """
        layer = self.shared_layers[module.layer_idx]
        b, hq, q, d = query.shape
        pk, pv = layer.prefix_keys, layer.prefix_values  # [Hkv, S, D]
        hkv, s = pk.shape[0], pk.shape[1]
        g, t = hq // hkv, key.shape[2]
        scale = kwargs.get("scaling") or 1.0 / math.sqrt(d)
        qh = (query * scale).reshape(b, hkv, g * q, d)  # query head h reads KV head h // g (repeat_kv order)
        flat = qh.transpose(0, 1).reshape(hkv, b * g * q, d)
        scores = query.new_empty(hkv, b, g * q, s + t)
        scores[..., :s] = torch.bmm(flat, pk.transpose(1, 2)).view(hkv, b, g * q, s)
        scores[..., :s].masked_fill_(~layer.keep.transpose(0, 1)[:, :, None, :], float("-inf"))
        slot, row = torch.arange(t, device=query.device), torch.arange(q, device=query.device)
        causal = slot[None, :] <= t - q + row[:, None]  # [q, t]: the q newest entries are this forward's tokens
        allowed = layer.valid[:, None, :] & causal.repeat(g, 1)[None]  # [B, g·q, t]
        new = torch.matmul(qh, key.transpose(2, 3)).masked_fill_(~allowed[:, None], float("-inf"))  # [B, Hkv, gq, t]
        scores[..., s:] = new.transpose(0, 1)
        probs = torch.softmax(scores, dim=-1, out=scores)
        out = torch.bmm(probs[..., :s].reshape(hkv, b * g * q, s), pv).view(hkv, b, g * q, d).transpose(0, 1)
        out = out + torch.matmul(probs[..., s:].transpose(0, 1), value)  # [B, Hkv, gq, D]
        return out.reshape(b, hq, q, d).transpose(1, 2).contiguous(), None

    def forward_kwargs(self) -> dict:
        from kvviz.capture.attention_fn import OVERRIDE_KWARG

        return {OVERRIDE_KWARG: self.attend}
