"""A prefix cache of KV blocks keyed by chained hash: LRU, bounded in bytes, reference counted.

The data structure a paged serving engine needs to reuse a prefill: a request hashes its full
prompt blocks (:mod:`kvviz.blocks.hashing`), takes the longest run of leading blocks already cached
(:meth:`PrefixCache.acquire`, which pins them), computes only the rest and inserts those blocks
(:meth:`PrefixCache.insert`); when it finishes it releases its blocks. A released block stays cached
until the byte budget needs its room: only blocks no running request holds are evicted, least
recently used first. A request releases its blocks last-to-first, so a prefix's tail goes before
its head (the head is what other requests are most likely to share).

    cache = PrefixCache(capacity_bytes=64 * 720 * 1024)
    held = cache.acquire(hashes)                     # cached leading blocks, pinned
    for h in hashes[len(held):]:
        held.append(cache.insert(h, nbytes=720 * 1024, payload=kv_of_block))
    ...
    cache.release(held)

``payload`` is whatever the engine stores for a block (its KV tensors, a block id); the cache only
counts ``nbytes``. ``on_evict`` hears of every block evicted to make room (a second tier keeps it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CachedBlock:
    """One cached block: its chained hash, size, the requests holding it, and the engine's payload."""

    block_hash: bytes
    nbytes: int
    ref_count: int = 0
    payload: Any = None
    hits: int = 0  # times a request found it already cached


@dataclass
class CacheStats:
    """Hit statistics in blocks (a hit is a block whose prefill a request did not have to compute)."""

    requests: int = 0
    queried_blocks: int = 0
    hit_blocks: int = 0
    inserted_blocks: int = 0
    evicted_blocks: int = 0
    refused_blocks: int = 0  # inserts that did not fit because every cached block was in use
    evicted_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of looked-up blocks found cached (0 before any lookup)."""
        return self.hit_blocks / self.queried_blocks if self.queried_blocks else 0.0


@dataclass
class PrefixCache:
    """Blocks by chained hash, at most ``capacity_bytes`` in all (see the module docstring)."""

    capacity_bytes: int
    stats: CacheStats = field(default_factory=CacheStats)
    on_evict: Callable[[CachedBlock], None] | None = None  # told of each block evicted to make room

    def __post_init__(self) -> None:
        if isinstance(self.capacity_bytes, bool) or not isinstance(self.capacity_bytes, int) or self.capacity_bytes < 0:
            raise ValueError(f"capacity must be a whole number of bytes ≥ 0; got {self.capacity_bytes!r}.")
        self._blocks: dict[bytes, CachedBlock] = {}
        self._free: OrderedDict[bytes, None] = OrderedDict()  # unreferenced blocks, least recently used first
        self.used_bytes = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    def get(self, block_hash: bytes) -> CachedBlock | None:
        return self._blocks.get(block_hash)

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def match(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of ``hashes`` are cached (no side effects)."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def acquire(self, hashes: Sequence[bytes]) -> list[CachedBlock]:
        """Pin and return the cached leading blocks of a request; counts the lookup in :attr:`stats`.

        Stops at the first block not cached: a later block's KV is only valid after the same prefix.
        """
        n = self.match(hashes)
        self.stats.requests += 1
        self.stats.queried_blocks += len(hashes)
        self.stats.hit_blocks += n
        held = [self._pin(h) for h in hashes[:n]]
        for block in held:
            block.hits += 1
        return held

    def pin(self, block_hash: bytes) -> CachedBlock | None:
        """One more leading block of a request :meth:`acquire` already counted (the run went on after a block
        a second tier supplied): pinned and counted as a hit when cached, else None."""
        if block_hash not in self._blocks:
            return None
        block = self._pin(block_hash)
        block.hits += 1
        self.stats.hit_blocks += 1
        return block

    def insert(self, block_hash: bytes, nbytes: int, payload: Any = None) -> CachedBlock | None:
        """Add a freshly computed block, pinned for its request; None when it cannot fit.

        A block already cached (another request computed it meanwhile) is pinned and returned instead.
        To make room, unreferenced blocks are evicted least recently used first.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a whole number ≥ 0; got {nbytes!r}.")
        if block_hash in self._blocks:
            return self._pin(block_hash)
        if not self._make_room(nbytes):
            self.stats.refused_blocks += 1
            return None
        block = CachedBlock(block_hash, nbytes, ref_count=1, payload=payload)
        self._blocks[block_hash] = block
        self.used_bytes += nbytes
        self.stats.inserted_blocks += 1
        return block

    def release(self, blocks: Iterable[CachedBlock | None]) -> None:
        """A request is done with its blocks (given first to last); they stay cached until evicted."""
        for block in reversed(list(blocks)):
            if block is None:
                continue
            if block.ref_count <= 0:
                raise ValueError("release of a block no request holds.")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_hash] = None  # most recently used end

    def eviction_order(self) -> list[CachedBlock]:
        """Every cached block, the next to evict first: unreferenced blocks least recently used first,
        then the blocks requests hold (not evictable while held), oldest insert first."""
        free = [self._blocks[h] for h in self._free]
        return free + [b for b in self._blocks.values() if b.ref_count > 0]

    def evictable_bytes(self) -> int:
        return sum(self._blocks[h].nbytes for h in self._free)

    # ---- internals ---------------------------------------------------------------------------
    def _pin(self, block_hash: bytes) -> CachedBlock:
        block = self._blocks[block_hash]
        block.ref_count += 1
        self._free.pop(block_hash, None)
        return block

    def _make_room(self, nbytes: int) -> bool:
        if nbytes > self.capacity_bytes or nbytes > self.free_bytes + self.evictable_bytes():
            return False
        while self.free_bytes < nbytes:
            victim, _ = self._free.popitem(last=False)
            block = self._blocks.pop(victim)
            self.used_bytes -= block.nbytes
            self.stats.evicted_blocks += 1
            self.stats.evicted_bytes += block.nbytes
            if self.on_evict is not None:
                self.on_evict(block)
        return True
