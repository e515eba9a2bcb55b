"""Eviction meets paging: how many blocks an eviction policy actually frees, and what compaction costs.

A policy drops tokens per layer and KV head, but a paged engine frees memory a block at a time: a
block frees only when *every* slot in it is evicted. Scattered choices (H2O's heavy hitters,
SnapKV's votes) leave a survivor in most blocks, so many tokens evicted free few blocks unless the
survivors are moved together (compaction). A vLLM block also holds every KV head of its layer, so
there it frees only when all heads evicted all its slots.

    from kvviz.blocks.eviction import from_run
    p = from_run(run_policy(lm, ids, make_policy("h2o"), budget=64, max_new_tokens=1), block_size=16)
    p.tokens_evicted, p.blocks_freed, p.compaction_bytes_moved
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvviz.blocks.hashing import check_block_size
from kvviz.blocks.table import blocks_for

PAGE_ALIGNED_NOTE = (
    "Page-aligned policies free more: evicting whole chunks of block-size tokens (the same chunk "
    "in every KV head) empties one block per block-size tokens evicted, with nothing to move, "
    "while scattered per-head choices leave a survivor in most blocks."
)


@dataclass(frozen=True)
class EvictionPaging:
    """Blocks before and after one eviction, per layer and KV head (arrays are [layers, kv_heads])."""

    policy: str
    block_size: int
    n_tokens: int  # positions the policy chose from (0 … n_tokens − 1), each once in every head
    occupancy: np.ndarray  # [Lyr, Hkv, blocks] survivors in each block
    bytes_per_entry: int  # one token's key and value in one KV head of one layer

    @property
    def blocks_before(self) -> int:
        return blocks_for(self.n_tokens, self.block_size)

    @property
    def kept(self) -> np.ndarray:
        return self.occupancy.sum(-1)

    @property
    def tokens_evicted(self) -> np.ndarray:
        return self.n_tokens - self.kept

    @property
    def blocks_freed(self) -> np.ndarray:
        """Blocks with no survivor, per layer and KV head."""
        return (self.occupancy == 0).sum(-1)

    @property
    def blocks_freed_all_heads(self) -> np.ndarray:
        """[Lyr] blocks empty in every KV head: what frees when one block holds all heads of a layer (vLLM)."""
        return (self.occupancy.sum(1) == 0).sum(-1)

    @property
    def page_aligned_blocks(self) -> np.ndarray:
        """Blocks the same number of evicted tokens would free if they were whole, aligned blocks."""
        return self.tokens_evicted // self.block_size

    @property
    def blocks_after_compaction(self) -> np.ndarray:
        return -(-self.kept // self.block_size)

    @property
    def moved_entries(self) -> np.ndarray:
        """Fewest entries compaction moves: keep the fullest blocks in place, move the rest into their holes."""
        need = self.blocks_after_compaction  # [Lyr, Hkv]
        fullest = -np.sort(-self.occupancy, axis=-1)  # [Lyr, Hkv, blocks], descending
        stay = np.where(np.arange(fullest.shape[-1]) < need[..., None], fullest, 0).sum(-1)
        return self.kept - stay

    @property
    def compaction_bytes_moved(self) -> int:
        return int(self.moved_entries.sum()) * self.bytes_per_entry

    @property
    def freed_bytes(self) -> int:
        """Bytes returned to the pool without compaction (blocks freed per head × slots × entry bytes)."""
        return int(self.blocks_freed.sum()) * self.block_size * self.bytes_per_entry

    @property
    def evicted_bytes(self) -> int:
        return int(self.tokens_evicted.sum()) * self.bytes_per_entry

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "block_size": self.block_size,
            "n_tokens": self.n_tokens,
            "blocks_before": self.blocks_before,
            "tokens_evicted": self.tokens_evicted.tolist(),
            "blocks_freed": self.blocks_freed.tolist(),
            "blocks_freed_all_heads": self.blocks_freed_all_heads.tolist(),
            "blocks_after_compaction": self.blocks_after_compaction.tolist(),
            "compaction_bytes_moved": self.compaction_bytes_moved,
            "freed_bytes": self.freed_bytes,
            "evicted_bytes": self.evicted_bytes,
        }


def paging_after_eviction(
    kept: np.ndarray, n_tokens: int, block_size: int, bytes_per_entry: int, policy: str = ""
) -> EvictionPaging:
    """Block occupancy after a policy kept ``kept`` [Lyr, Hkv, k] positions out of ``0 … n_tokens − 1``.

    Positions outside that range (or repeated) are an error: they would count survivors twice.
    """
    b = check_block_size(block_size)
    kept = np.asarray(kept)
    if kept.ndim != 3:
        raise ValueError(f"kept must be [layers, kv_heads, k]; got shape {kept.shape}.")
    if kept.size and (kept.min() < 0 or kept.max() >= n_tokens):
        raise ValueError(f"kept positions must lie in 0 … {n_tokens - 1}.")
    if kept.shape[-1] > 1 and (np.diff(np.sort(kept, axis=-1), axis=-1) == 0).any():
        raise ValueError("a position is kept twice in one KV head.")
    lyr, hkv, _ = kept.shape
    occupancy = np.zeros((lyr, hkv, blocks_for(n_tokens, b)), dtype=np.int64)
    rows = np.broadcast_to(np.arange(lyr)[:, None, None], kept.shape)
    heads = np.broadcast_to(np.arange(hkv)[None, :, None], kept.shape)
    np.add.at(occupancy, (rows, heads, kept // b), 1)
    return EvictionPaging(policy, b, int(n_tokens), occupancy, int(bytes_per_entry))


def from_run(run, block_size: int) -> EvictionPaging:
    """The prefill decision of a :class:`~kvviz.eviction.run.PolicyRun`, laid into blocks."""
    lyr, hkv = run.kept.shape[:2]
    per_entry = run.kv_bytes_per_token // (lyr * hkv)
    return paging_after_eviction(run.kept, run.n_compressed, block_size, per_entry, run.policy)
