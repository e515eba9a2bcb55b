"""The decoding room's keys and values side by side: one buffer per layer, a slot per running sequence.

A packed decode step of B sequences appends one key and one value per sequence per layer, and the
batched SDPA call then wants all B caches as one [B, Hkv, longest, D] tensor. With a cache of its own
per sequence (``DynamicCache``) that is 2·B concatenations and 2·B padding copies per layer per step —
a few thousand small operations a step for a room, more than its attention arithmetic. :class:`SlotKV`
keeps every attached sequence's cache in one zero-initialised buffer per layer, ``[slots, Hkv,
capacity, D]``: a sequence's :class:`SlotLayer` writes its new entries into its slot and shows the
filled part as its ``keys`` / ``values`` (views, so everything that reads a transformers cache layer
reads it unchanged), a decode step appends for all sequences in one indexed write per layer
(:meth:`SlotKV.append`), and the batched attention reads the buffer (:meth:`SlotKV.batch`) — a view
when the sequences hold adjacent slots, one gather otherwise. The values are the ones a sequence's own
cache would hold; only where they sit differs.

Only short runs take a slot (at most :data:`MAX_TOKENS` prompt and new tokens): the buffers are sized
by the longest attached run, and one long run would make every slot that long. They are dropped when
the last sequence leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

import torch
from transformers.cache_utils import DynamicLayer

MAX_TOKENS = 256  # prompt + new tokens of the longest run that takes a slot
ROUND = 32  # a slot's tokens are allocated in steps of this many


def _rounded(tokens: int, capacity: int) -> int:
    """A slot's allocated length for a run of ``tokens``: up to a multiple of :data:`ROUND`, at most ``capacity``."""
    return min(-(-tokens // ROUND) * ROUND, capacity)


class SlotLayer(DynamicLayer):
    """One layer of one sequence's cache, stored in its slot of a :class:`SlotKV`. Its ``keys`` and ``values``
    are views of the slot's filled part, made when read: a room's decode step appends to every slot of every
    layer at once, and making two views per sequence per layer there cost more than the append itself."""

    def __init__(self, store: SlotKV, slot: int, layer: int):
        self.is_initialized = False  # not DynamicLayer's __init__: its keys and values are the slot's (below)
        self.store, self.slot, self.layer, self.length = store, slot, layer, 0

    @property
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._view(0)

    @property
    def values(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._view(1)

    def _view(self, which: int) -> torch.Tensor | None:
        if not self.is_initialized:
            return None
        return self.store.buffers(self.layer)[which][self.slot : self.slot + 1, :, : self.length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.store.allocate(self.layer, key_states, value_states)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        if self.length + n > self.store.size[1]:
            raise RuntimeError(f"a slot of {self.store.size[1]} tokens cannot take {self.length + n}.")
        k, v = self.store.buffers(self.layer)
        k[self.slot, :, self.length : self.length + n] = key_states[0]
        v[self.slot, :, self.length : self.length + n] = value_states[0]
        self.length += n
        return self.keys, self.values

    def kv_held(self) -> tuple[int, int]:
        """Entries held and their bytes (keys and values), without making the views
        (:func:`~kvviz.capture.model_io.cache_layer_bytes` asks every layer of every run at every step)."""
        return (self.length, self.length * self.store.entry_bytes[self.layer]) if self.is_initialized else (0, 0)

    def get_seq_length(self) -> int:
        return self.length


class SlotKV:
    """See the module docstring: at most ``slots`` sequences of at most ``capacity`` tokens each. The
    buffers are only as large as the attached runs need — as many slots as the highest one taken, as
    many tokens as the longest run, rounded up to :data:`ROUND` — and grow (a copy) when a run needs more."""

    def __init__(self, layers: int, slots: int, capacity: int = MAX_TOKENS):
        self.layers, self.slots, self.capacity = layers, slots, capacity
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.entry_bytes = [0] * layers  # per layer: the bytes of one entry (its key and value, every head)
        self.size = (0, 0)  # (slots, tokens) the buffers are, or will be, allocated with
        self._free = list(range(slots))
        self._held: dict[int, list[SlotLayer]] = {}
        self._last: tuple | None = None  # the latest append's key and index tensors (see _where)

    def attach(self, cache, tokens: int) -> bool:
        """Give an empty transformers cache of full-attention layers a slot: its layers become
        :class:`SlotLayer` objects. False (the cache untouched) when no slot is free, the run is longer than
        a slot, or the cache is not an empty ``DynamicLayer`` cache with one layer per model layer."""
        if not self._free or not self._fits(cache, tokens):
            return False
        slot = self._free.pop(0)
        self._fit(slot + 1, _rounded(tokens, self.capacity))
        own = [SlotLayer(self, slot, i) for i in range(self.layers)]
        cache.layers[:] = own
        self._held[slot] = own
        return True

    def attach_all(self, requests: Sequence[tuple[object, int]]) -> list[bool]:
        """:meth:`attach` for several (cache, tokens) at once, the buffers grown once for every one that gets
        a slot. One at a time, each new slot would copy every layer's buffers and re-point every held slot's
        views again: for a room's two dozen arrivals behind a run already decoding, that is quadratic (a
        quarter of a second before their first step)."""
        taking = [tokens for cache, tokens in requests if self._fits(cache, tokens)][: len(self._free)]
        if taking:  # the slots they will get are the lowest free ones, in order
            self._fit(self._free[len(taking) - 1] + 1, _rounded(max(taking), self.capacity))
        return [self.attach(cache, tokens) for cache, tokens in requests]

    def _fits(self, cache, tokens: int) -> bool:
        """Whether a run of ``tokens`` tokens with this cache may take a slot (one being free aside)."""
        layers = getattr(cache, "layers", None)
        return not (
            tokens > self.capacity
            or layers is None
            or len(layers) != self.layers
            or any(type(layer) is not DynamicLayer or layer.is_initialized for layer in layers)
        )

    def _fit(self, slots: int, tokens: int) -> None:
        """Make the buffers hold at least ``slots`` slots of ``tokens`` tokens, copying what they hold."""
        have_s, have_t = self.size
        if slots <= have_s and tokens <= have_t:
            return
        self.size = new = (max(slots, have_s), max(tokens, have_t))
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is None or v is None:
                continue
            bigger_k = torch.zeros(new[0], k.shape[1], new[1], k.shape[3], dtype=k.dtype, device=k.device)
            bigger_v = torch.zeros(new[0], v.shape[1], new[1], v.shape[3], dtype=v.dtype, device=v.device)
            bigger_k[: k.shape[0], :, : k.shape[2]] = k
            bigger_v[: v.shape[0], :, : v.shape[2]] = v
            self.keys[i], self.values[i] = bigger_k, bigger_v

    def detach(self, cache) -> None:
        """Free the slot of a cache :meth:`attach` gave one (a no-op for any other cache): call it once the
        run no longer reads its cache. Its layers become empty ``DynamicLayer`` objects, so the slot's next
        sequence is never seen through them."""
        layers = getattr(cache, "layers", None) or []
        mine = [layer for layer in layers if isinstance(layer, SlotLayer) and layer.store is self]
        if not mine:
            return
        slot = mine[0].slot
        for layer in mine:
            del layer.store, layer.slot, layer.layer, layer.length
            layer.__class__ = DynamicLayer  # type: ignore[assignment]  # a plain layer from here on
            layer.keys = layer.values = None  # type: ignore[misc]  # a DynamicLayer's own attributes now
            layer.is_initialized = False
        self._held.pop(slot, None)
        self._free.append(slot)
        self._free.sort()
        if not self._held:  # the room has left: the next one sizes its own buffers
            self.keys, self.values = [None] * self.layers, [None] * self.layers
            self.size = (0, 0)

    def allocate(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if self.keys[layer] is None:
            slots, tokens = self.size
            hkv, dk, dv = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
            dtype, device = key_states.dtype, key_states.device
            self.keys[layer] = torch.zeros(slots, hkv, tokens, dk, dtype=dtype, device=device)
            self.values[layer] = torch.zeros(slots, hkv, tokens, dv, dtype=dtype, device=device)
            self.entry_bytes[layer] = hkv * (dk + dv) * key_states.element_size()

    def buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s key and value buffers ([slots, Hkv, capacity, D]); allocated at its first write."""
        k, v = self.keys[layer], self.values[layer]
        if k is None or v is None:
            raise RuntimeError(f"layer {layer} of the slot store holds nothing yet.")
        return k, v

    def owns(self, layers: Sequence) -> TypeGuard[Sequence[SlotLayer]]:
        """Whether every one of these cache layers is an initialised slot of this store."""
        return all(isinstance(x, SlotLayer) and x.store is self and x.is_initialized for x in layers)

    def append(self, layer: int, owners: Sequence[SlotLayer], key_states: torch.Tensor, value_states, rows) -> None:
        """One new entry per sequence, in one indexed write: ``owners[j]`` (all of layer ``layer``) takes
        row ``rows[j]`` of the packed ``key_states`` / ``value_states`` ([1, Hkv, N, D])."""
        slots, at, pick = self._where(owners, rows, key_states.device)
        k, v = self.buffers(layer)
        k[slots, :, at] = key_states[0][:, pick].transpose(0, 1)
        v[slots, :, at] = value_states[0][:, pick].transpose(0, 1)
        for o in owners:
            o.length += 1

    def _where(self, owners: Sequence[SlotLayer], rows, device) -> tuple[torch.Tensor, ...]:
        """The index tensors of an append (slots, write positions, packed rows). Every layer of a decode
        step asks for the same ones: they are made once per step, not once per layer."""
        key = (tuple(o.slot for o in owners), tuple(o.length for o in owners), tuple(rows), device, self.size)
        if self._last is None or self._last[0] != key:
            if max(key[1]) >= self.size[1]:
                raise RuntimeError(f"a slot of {self.size[1]} tokens is full.")
            self._last = (key, tuple(torch.tensor(list(x), device=device) for x in key[:3]))
        return self._last[1]

    def batch(self, layer: int, owners: Sequence[SlotLayer]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The owners' keys and values of layer ``layer`` as [B, Hkv, longest, D] (a view of the buffer when
        their slots are adjacent and in order, else gathered) and each one's length."""
        lens = [o.length for o in owners]
        width = max(lens)
        k, v = (x[:, :, :width] for x in self.buffers(layer))
        first = owners[0].slot
        if [o.slot for o in owners] == list(range(first, first + len(owners))):
            return k[first : first + len(owners)], v[first : first + len(owners)], lens
        idx = torch.tensor([o.slot for o in owners], device=k.device)
        return k.index_select(0, idx), v.index_select(0, idx), lens
