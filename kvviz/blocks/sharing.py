"""Prefix sharing: several prompts' block tables over one pool, full blocks found by chained hash.

The prompts arrive one after the other at a paged engine with a prefix cache
(:class:`~kvviz.blocks.prefix_cache.PrefixCache`). Each looks up its full blocks by chained hash;
the leading run found is reused (drawn once, shared), the rest is computed and cached for the
next prompt. As in vLLM, the last prompt token is always computed (its logits start the answer),
so a prompt entirely in the cache still computes its last block.

    from kvviz.blocks.sharing import share
    s = share([ids_a, ids_b], tables=[table_a, table_b])
    s.shared_blocks, s.bytes_saved, s.prefill_tokens_saved
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvviz.blocks.hashing import BlockHasher, common_prefix
from kvviz.blocks.prefix_cache import CacheStats, PrefixCache
from kvviz.blocks.table import BlockTable, blocks_for


@dataclass(frozen=True)
class PromptBlocks:
    """One prompt's logical blocks and the physical block each maps to."""

    name: str
    token_ids: tuple[int, ...]
    table: BlockTable  # measured from this prompt's own prefill cache
    hashes: tuple[bytes, ...]  # chained hashes of its full blocks
    cached_blocks: int  # leading blocks found in the prefix cache when it arrived
    block_ids: tuple[int, ...]  # physical block of each logical block (a shared one appears in several prompts)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def n_blocks(self) -> int:
        return len(self.block_ids)

    @property
    def new_blocks(self) -> int:
        return self.n_blocks - self.cached_blocks

    @property
    def full_blocks(self) -> int:
        return len(self.hashes)


@dataclass(frozen=True)
class Sharing:
    """Every prompt's blocks over one pool, and what sharing saved."""

    block_size: int
    prompts: tuple[PromptBlocks, ...]
    shared_blocks: int  # full blocks of the token prefix common to every prompt
    bytes_per_block: int  # one block in every layer, from the first prompt's cache tensors
    physical_blocks: int  # distinct blocks in the pool
    stats: CacheStats
    ref_counts: dict[int, int]  # physical block → prompts using it

    @property
    def logical_blocks(self) -> int:
        return sum(p.n_blocks for p in self.prompts)

    @property
    def cached_blocks(self) -> int:
        return sum(p.cached_blocks for p in self.prompts)

    @property
    def bytes_saved(self) -> int:
        """Bytes the pool did not allocate because a block was reused."""
        return self.cached_blocks * self.bytes_per_block

    @property
    def prefill_tokens_saved(self) -> int:
        """Prompt tokens whose keys and values were not recomputed."""
        return self.cached_blocks * self.block_size

    @property
    def prefill_tokens(self) -> int:
        return sum(p.n_tokens for p in self.prompts)

    def to_json(self) -> dict:
        return {
            "block_size": self.block_size,
            "shared_blocks": self.shared_blocks,
            "bytes_per_block": self.bytes_per_block,
            "bytes_saved": self.bytes_saved,
            "prefill_tokens_saved": self.prefill_tokens_saved,
            "prefill_tokens": self.prefill_tokens,
            "physical_blocks": self.physical_blocks,
            "logical_blocks": self.logical_blocks,
            "hit_rate": self.stats.hit_rate,
        }


def share(
    token_lists: Sequence[Sequence[int]],
    tables: Sequence[BlockTable],
    names: Sequence[str] = (),
    extra: str | None = None,
) -> Sharing:
    """Admit the prompts in order through one prefix cache and map their blocks onto one pool."""
    if len(token_lists) != len(tables) or not tables:
        raise ValueError("give one block table per prompt (at least one prompt).")
    b = tables[0].block_size
    if any(t.block_size != b for t in tables):
        raise ValueError("every prompt must use the same block size.")
    hasher = BlockHasher(b, extra)
    per_block = tables[0].bytes_per_block
    cache = PrefixCache(capacity_bytes=per_block * sum(blocks_for(len(ids), b) for ids in token_lists))
    next_id = 0
    refs: dict[int, int] = {}
    out = []
    for k, (ids, table) in enumerate(zip(token_lists, tables)):
        ids = tuple(int(t) for t in ids)
        if not ids:
            raise ValueError(f"prompt {k + 1} is empty.")
        hashes = hasher(ids)
        reusable = (len(ids) - 1) // b  # the last token is always computed
        held = cache.acquire(hashes[:reusable])
        block_ids = [blk.payload for blk in held]
        for h in hashes[len(held) :]:
            if h not in cache:  # a block recomputed although cached (the last one) gets its own copy
                cache.insert(h, per_block, payload=next_id)
            block_ids.append(next_id)
            next_id += 1
        if len(ids) % b:  # the partly filled last block is private (not hashed)
            block_ids.append(next_id)
            next_id += 1
        for i in block_ids:
            refs[i] = refs.get(i, 0) + 1
        name = names[k] if k < len(names) else f"prompt {k + 1}"
        out.append(PromptBlocks(name, ids, table, tuple(hashes), len(held), tuple(block_ids)))
    shared = common_prefix([p.token_ids for p in out]) // b if len(out) > 1 else 0
    return Sharing(b, tuple(out), shared, per_block, next_id, cache.stats, refs)
