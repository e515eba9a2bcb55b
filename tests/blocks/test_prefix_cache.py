"""Chained block hashes and the prefix cache: the pieces a serving engine with shared prefixes reuses."""

from __future__ import annotations

import pytest

from kvviz.blocks.hashing import BlockHasher, block_hashes, common_prefix
from kvviz.blocks.prefix_cache import PrefixCache


def test_only_full_blocks_are_hashed_and_the_chain_carries_the_prefix():
    a = block_hashes(list(range(10)), 4)
    assert len(a) == 2  # 10 tokens: blocks 0–3, 4–7; 8–9 still filling
    b = block_hashes([0, 1, 2, 3, 4, 5, 6, 7, 99], 4)
    assert b == a  # same first 8 tokens
    c = block_hashes([9, 1, 2, 3, 4, 5, 6, 7], 4)
    assert c[0] != a[0] and c[1] != a[1], "block 1 has the same tokens but a different prefix"
    assert block_hashes([1, 23, 0, 0], 4) != block_hashes([12, 3, 0, 0], 4)
    assert BlockHasher(4, extra="lora-a")(list(range(4))) != a[:1]
    assert block_hashes(list(range(8)), 4) == block_hashes(list(range(8)), 4), "the same in every process"


def test_block_size_is_checked():
    for bad in (0, -1, 2.0, True, 10**6):
        with pytest.raises(ValueError, match="block size"):
            BlockHasher(bad)


def test_common_prefix():
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix([[1, 2], [3]]) == 0 and common_prefix([[5, 6]]) == 2 and common_prefix([]) == 0


def test_a_request_reuses_the_leading_blocks_another_computed():
    cache = PrefixCache(capacity_bytes=10 * 100)
    first = block_hashes(list(range(16)), 4)  # 4 blocks
    held = cache.acquire(first)
    assert held == [] and cache.stats.hit_blocks == 0
    held = [cache.insert(h, 100, payload=i) for i, h in enumerate(first)]
    assert len(cache) == 4 and cache.used_bytes == 400 and all(b.ref_count == 1 for b in held)

    second = block_hashes(list(range(8)) + [50] * 8, 4)  # shares the first 2 blocks
    again = cache.acquire(second)
    assert [b.payload for b in again] == [0, 1] and [b.ref_count for b in again] == [2, 2]
    assert cache.stats.hit_blocks == 2 and cache.stats.queried_blocks == 8
    assert cache.stats.hit_rate == pytest.approx(2 / 8)
    assert cache.match(second) == 2 and cache.match(first) == 4


def test_lru_eviction_under_the_byte_budget_spares_blocks_in_use():
    cache = PrefixCache(capacity_bytes=300)
    a = [cache.insert(h, 100) for h in block_hashes(list(range(12)), 4)]  # fills the budget
    assert cache.insert(b"x" * 32, 100) is None and cache.stats.refused_blocks == 1, "all in use: refused"
    cache.release(a)  # released last-to-first: the tail is the least recently used
    assert all(b.ref_count == 0 for b in a) and len(cache) == 3, "released blocks stay cached"
    new = cache.insert(b"y" * 32, 100)
    assert new is not None and a[2].block_hash not in cache and a[0].block_hash in cache
    assert cache.stats.evicted_blocks == 1 and cache.stats.evicted_bytes == 100
    assert cache.used_bytes == 300
    hit = cache.acquire([a[0].block_hash])  # touching a block makes it recent and pins it
    cache.insert(b"z" * 32, 100)
    assert a[1].block_hash not in cache and a[0].block_hash in cache
    cache.release(hit)
    with pytest.raises(ValueError, match="no request holds"):
        cache.release(hit)


def test_oversized_and_bad_inserts():
    cache = PrefixCache(capacity_bytes=100)
    assert cache.insert(b"big", 101) is None
    with pytest.raises(ValueError, match="nbytes"):
        cache.insert(b"neg", -1)
    with pytest.raises(ValueError, match="capacity"):
        PrefixCache(capacity_bytes=-5)
    again = cache.insert(b"k", 10)
    assert cache.insert(b"k", 10) is again and again.ref_count == 2, "an existing block is pinned, not copied"


def test_eviction_order_puts_the_next_victim_first_and_held_blocks_last():
    cache = PrefixCache(capacity_bytes=1000)
    a = [cache.insert(h, 100) for h in block_hashes(list(range(12)), 4)]
    b = cache.insert(b"b" * 32, 100)
    assert [x.block_hash for x in cache.eviction_order()] == [x.block_hash for x in [*a, b]], "all held: by insert"
    cache.release(a)  # tail first: a[2] is the least recently used
    assert [x.block_hash for x in cache.eviction_order()] == [x.block_hash for x in [a[2], a[1], a[0], b]]
    cache.release([b])
    assert cache.eviction_order()[-1] is b, "the most recently released comes last"
