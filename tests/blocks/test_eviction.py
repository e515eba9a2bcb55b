"""Eviction meets paging: freed blocks and compaction moves against brute force, and on real policy runs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvviz.blocks.eviction import from_run, paging_after_eviction
from kvviz.blocks.live import evict_and_page
from kvviz.capture.model_io import encode_prompt
from kvviz.eviction.policies import make_policy
from kvviz.eviction.run import run_policy


def brute_freed(kept: set[int], n: int, b: int) -> int:
    return sum(all(p not in kept for p in range(j, min(j + b, n))) for j in range(0, n, b))


def brute_moves(kept: set[int], n: int, b: int) -> int:
    """Try every choice of ⌈k / b⌉ blocks to stay; the rest of the kept entries move."""
    blocks = [sum(p in kept for p in range(j, min(j + b, n))) for j in range(0, n, b)]
    m = -(-len(kept) // b)
    best = max((sum(c) for c in itertools.combinations(blocks, m)), default=0)
    return len(kept) - best


@pytest.mark.parametrize("seed", range(6))
def test_freed_blocks_and_moves_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    n, b, k = int(rng.integers(20, 60)), int(rng.choice([4, 8, 16])), int(rng.integers(1, 19))
    kept = np.stack([np.stack([np.sort(rng.choice(n, k, replace=False)) for _ in range(3)]) for _ in range(2)])
    p = paging_after_eviction(kept, n, b, bytes_per_entry=512, policy="random")
    for layer in range(2):
        for head in range(3):
            s = set(kept[layer, head].tolist())
            assert p.blocks_freed[layer, head] == brute_freed(s, n, b)
            assert p.moved_entries[layer, head] == brute_moves(s, n, b)
            assert p.tokens_evicted[layer, head] == n - k
        union = set(kept[layer].ravel().tolist())
        assert p.blocks_freed_all_heads[layer] == brute_freed(union, n, b)
    assert p.compaction_bytes_moved == int(p.moved_entries.sum()) * 512


def test_hand_computed_case():
    # 40 tokens in blocks of 8; kept 0–3 (sinks) and 30–31: blocks 1, 2 and 4 are empty
    p = paging_after_eviction(np.array([[[0, 1, 2, 3, 30, 31]]]), 40, 8, 512)
    assert p.blocks_before == 5 and p.occupancy.tolist() == [[[4, 0, 0, 2, 0]]]
    assert p.blocks_freed.tolist() == [[3]] and p.page_aligned_blocks.tolist() == [[34 // 8]]
    assert p.blocks_after_compaction.tolist() == [[1]] and p.moved_entries.tolist() == [[2]]
    assert p.freed_bytes == 3 * 8 * 512 and p.evicted_bytes == 34 * 512
    with pytest.raises(ValueError, match="0 … 39"):
        paging_after_eviction(np.array([[[0, 40]]]), 40, 8, 512)
    with pytest.raises(ValueError, match="twice"):
        paging_after_eviction(np.array([[[3, 3]]]), 40, 8, 512)


def test_streaming_llm_frees_the_blocks_between_sinks_and_window(lm):
    ids = encode_prompt(lm, "The cache stores keys and values for every past token. " * 6, False)
    n, b = len(ids), 8
    run = run_policy(lm, ids, make_policy("streaming_llm", sinks=4), budget=20, max_new_tokens=1, record_history=False)
    p = from_run(run, b)
    # kept: 0–3 and the last 16; block 0 holds the sinks, blocks entirely inside [4, n − 16) are freed
    expected = (n - 16) // b - 1
    assert (p.blocks_freed == expected).all() and (p.blocks_freed_all_heads == expected).all()
    assert (p.tokens_evicted == n - 20).all() and p.bytes_per_entry == 512


def test_scattered_policies_free_no_more_than_page_aligned_eviction(lm):
    ids = encode_prompt(lm, "Paged attention stores the cache in blocks of sixteen tokens each. " * 5, True)
    runs = evict_and_page(lm, ids, [make_policy("h2o"), make_policy("snapkv", window_size=8)], budget=24, block_size=8)
    assert [r.name for r in runs] == ["h2o", "snapkv"] and all(r.budget == 24 for r in runs)
    for r in runs:
        p = r.paging
        assert (p.kept == 24).all() and p.n_tokens == len(ids)
        assert (p.blocks_freed <= p.page_aligned_blocks).all()
        assert (p.blocks_freed_all_heads <= p.blocks_freed.min(axis=1)).all()
        assert (p.blocks_after_compaction == 3).all() and p.compaction_bytes_moved > 0
