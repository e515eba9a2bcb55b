"""The live cache laid out in fixed-size blocks, and what a contiguous allocation would reserve instead.

A paged engine stores each layer's cache in blocks of ``block_size`` token slots and gives a
sequence a new block only when its last one is full, so at most ``block_size − 1`` slots per layer
are ever empty. A contiguous engine reserves every slot the sequence *might* use up front (the
prompt plus ``max_new_tokens``, or the model's whole context). The numbers here come from the real
cache: entries held per layer and the bytes of its key and value tensors (see
:func:`kvviz.capture.loop.cache_layer_bytes`), never from ``get_seq_length()``.

    from kvviz.blocks.table import from_trace
    table = from_trace(trace, block_size=16)       # after the last step of a Generate run
    table.blocks_per_layer, table.wasted_slots, table.bytes_per_block
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvviz.blocks.hashing import check_block_size


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed for ``tokens`` slots: ⌈tokens / block_size⌉."""
    return -(-int(tokens) // block_size)


@dataclass(frozen=True)
class LayerPages:
    """One layer's cache in blocks: entries held, blocks, empty slots in the last block, bytes per slot."""

    layer: int
    tokens: int
    first_position: int  # absolute position of the oldest entry (a sliding layer holds only the newest)
    blocks: int
    wasted_slots: int
    bytes_per_slot: int  # one token's keys and values in this layer, every KV head (measured)
    kv_heads: int

    @property
    def bytes_per_slot_per_head(self) -> int:
        return self.bytes_per_slot // self.kv_heads if self.kv_heads else 0


@dataclass(frozen=True)
class BlockTable:
    """A sequence's cache in blocks of ``block_size`` slots, layer by layer (each KV head alike)."""

    block_size: int
    kv_heads: int
    layers: tuple[LayerPages, ...]
    seen: int  # tokens that went through the model

    @property
    def blocks_per_layer(self) -> list[int]:
        return [p.blocks for p in self.layers]

    @property
    def blocks(self) -> int:
        """Blocks over every layer (one block = ``block_size`` slots of one layer, all its KV heads)."""
        return sum(self.blocks_per_layer)

    @property
    def wasted_slots_per_layer(self) -> list[int]:
        return [p.wasted_slots for p in self.layers]

    @property
    def wasted_slots(self) -> int:
        """Empty slots of the last block of a layer that holds every token (the sequence's block table)."""
        return blocks_for(self.seen, self.block_size) * self.block_size - self.seen

    @property
    def bytes_per_token(self) -> int:
        return sum(p.bytes_per_slot for p in self.layers)

    @property
    def bytes_per_block(self) -> int:
        """One block's slots in every layer: ``block_size`` × bytes per token (all layers, all KV heads)."""
        return self.block_size * self.bytes_per_token

    @property
    def used_bytes(self) -> int:
        """Bytes of the entries held (what the cache tensors measure)."""
        return sum(p.tokens * p.bytes_per_slot for p in self.layers)

    @property
    def paged_bytes(self) -> int:
        """Bytes of the blocks allocated: the held entries plus the empty slots of each last block."""
        return sum(p.blocks * self.block_size * p.bytes_per_slot for p in self.layers)

    @property
    def wasted_bytes(self) -> int:
        return self.paged_bytes - self.used_bytes

    def to_json(self) -> dict:
        return {
            "block_size": self.block_size,
            "tokens": [p.tokens for p in self.layers],
            "blocks": self.blocks_per_layer,
            "wasted_slots": self.wasted_slots,
            "wasted_slots_per_layer": self.wasted_slots_per_layer,
            "bytes_per_block": self.bytes_per_block,
            "used_bytes": self.used_bytes,
            "paged_bytes": self.paged_bytes,
        }


def block_table(
    cache_lens: Sequence[int],
    layer_bytes: Sequence[int],
    kv_heads: int,
    block_size: int,
    seen: int | None = None,
    fallback_bytes_per_slot: int = 0,
) -> BlockTable:
    """Blocks of a cache from its per-layer entries held and tensor bytes (as measured after a step).

    ``seen`` = tokens that went through the model (default: the longest layer); a layer holding
    fewer (a sliding window) holds the newest ones. ``fallback_bytes_per_slot`` sizes a layer that
    holds nothing yet, where bytes per slot cannot be measured.
    """
    b = check_block_size(block_size)
    if len(cache_lens) != len(layer_bytes):
        raise ValueError("cache_lens and layer_bytes must list one entry per layer.")
    seen = max(cache_lens, default=0) if seen is None else int(seen)
    layers = []
    for i, (n, nbytes) in enumerate(zip(cache_lens, layer_bytes)):
        n, nbytes = int(n), int(nbytes)
        if n and nbytes % n:
            raise ValueError(f"layer {i}: {nbytes} bytes is not a whole number of {n} slots.")
        per_slot = nbytes // n if n else int(fallback_bytes_per_slot)
        blocks = blocks_for(n, b)
        layers.append(LayerPages(i, n, seen - n, blocks, blocks * b - n, per_slot, kv_heads))
    return BlockTable(b, kv_heads, tuple(layers), seen)


def from_trace(trace, block_size: int, step: int = -1) -> BlockTable:
    """The block table of a :class:`~kvviz.capture.trace.Trace` after ``step`` (0 = the prefill)."""
    if not trace.steps:
        raise ValueError("The run has no steps yet.")
    s = trace.steps[step]
    info = trace.model
    fallback = info.kv_bytes_per_token // info.layers if info.layers else 0
    seen = trace.n_prompt + s.index  # the prefill fed the prompt, each later step one token
    return block_table(s.cache_lens, s.layer_bytes, info.stored_heads, block_size, seen, fallback)


def from_cache(cache, kv_heads: int, block_size: int, seen: int | None = None) -> BlockTable:
    """The block table of a live transformers cache, read from its tensors."""
    from kvviz.capture.model_io import cache_layer_bytes

    lens, sizes = cache_layer_bytes(cache)
    return block_table(lens, sizes, kv_heads, block_size, seen)


# ---- paged vs contiguous -----------------------------------------------------------------------
@dataclass(frozen=True)
class Allocation:
    """What one allocation scheme sets aside for the sequence, and how much of it holds nothing."""

    scheme: str
    reserved_tokens: int  # per layer that holds every token
    reserved_bytes: int
    used_bytes: int

    @property
    def wasted_bytes(self) -> int:
        return self.reserved_bytes - self.used_bytes

    @property
    def waste_share(self) -> float:
        return self.wasted_bytes / self.reserved_bytes if self.reserved_bytes else 0.0


def contiguous(table: BlockTable, reserve_tokens: int, scheme: str, windows: Sequence[int | None] = ()) -> Allocation:
    """A contiguous cache reserved for ``reserve_tokens`` up front in every layer.

    A layer with a sliding window (``windows[i]``) needs at most ``window − 1`` slots between steps,
    as transformers keeps it; a layer already holding more than the reserve keeps what it holds.
    """
    reserved = 0
    for p in table.layers:
        window = windows[p.layer] if p.layer < len(windows) else None
        slots = min(reserve_tokens, window - 1) if window else reserve_tokens
        reserved += max(slots, p.tokens) * p.bytes_per_slot
    return Allocation(scheme, int(reserve_tokens), reserved, table.used_bytes)


def paged(table: BlockTable) -> Allocation:
    return Allocation(
        f"paged ({table.block_size}-token blocks)",
        blocks_for(table.seen, table.block_size) * table.block_size,
        table.paged_bytes,
        table.used_bytes,
    )


def allocations(
    table: BlockTable, planned_tokens: int, context_length: int, windows: Sequence[int | None] = ()
) -> list[Allocation]:
    """Paged next to the two contiguous reservations: the planned length and the model's context."""
    planned = max(int(planned_tokens), table.seen)
    out = [paged(table), contiguous(table, planned, "contiguous: prompt + max_new_tokens", windows)]
    if context_length and context_length > 0:
        out.append(contiguous(table, max(int(context_length), table.seen), "contiguous: model context", windows))
    return out
