"""What a page size costs in reuse: a room's prompts replayed through a prefix cache at several block sizes.

A prefix cache reuses only full blocks whose every token up to the block's end matches
(:mod:`kvviz.blocks.hashing`). The tokens a request shares with an earlier one past its last full
shared block — the partial page — are computed again, and so are the tokens of a block that starts
alike but ends differently. The larger the block, the more of the shared prefix falls into that last
partial block: SGLang measured 7.5 / 15.5 / 31.5 tokens recomputed per request for 16 / 32 / 64-token
pages (half a page, as random prefix lengths give). :func:`replay` measures it on given prompts: each
request, in order, looks its blocks up in a :class:`~kvviz.blocks.prefix_cache.PrefixCache` that never
evicts (the loss is the page size's alone, not the byte budget's) and stores the ones it computed.

    frame = replay([ids_1, ids_2, ...], block_sizes=(8, 16, 32, 64))

The last prompt token is never looked up (its logits give the first new token), as in the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kvviz.blocks.hashing import BlockHasher, common_prefix
from kvviz.blocks.prefix_cache import CachedBlock, PrefixCache

BLOCK_SIZES = (8, 16, 32, 64)
COLUMNS = [
    "block size (tokens)",
    "requests",
    "hit rate",
    "prompt tokens per request",
    "shareable tokens per request",
    "reused tokens per request",
    "recomputed tokens per request",
    "partial-page loss per request",
]


def shareable(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Per request, the longest prefix (its last token excluded) it shares with any earlier request: what
    a cache of one-token blocks would reuse."""
    out = []
    for i, ids in enumerate(prompts):
        head = list(ids[:-1])
        out.append(max((common_prefix([head, prompts[j]]) for j in range(i)), default=0))
    return out


def replay(prompts: Sequence[Sequence[int]], block_sizes: Sequence[int] = BLOCK_SIZES) -> pd.DataFrame:
    """One row per block size: block hit rate, and per request the prompt tokens, the tokens it shares with an
    earlier request, those the cache reused, those it recomputed, and the partial-page loss (shared but
    recomputed). See the module docstring."""
    if not prompts or any(len(p) < 1 for p in prompts):
        raise ValueError("replay needs at least one prompt, none of them empty.")
    share = shareable(prompts)
    n = len(prompts)
    total = sum(len(p) for p in prompts)
    rows = []
    for b in block_sizes:
        cache, hasher = PrefixCache(capacity_bytes=total), BlockHasher(b)
        reused = 0
        for ids in prompts:
            hashes = hasher(list(ids[: (len(ids) - 1) // b * b]))
            held: list[CachedBlock | None] = list(cache.acquire(hashes))
            reused += len(held) * b
            for h in hashes[len(held) :]:
                held.append(cache.insert(h, b))  # one byte a token: the cache's bound never binds
            cache.release(held)
        rows.append(
            [
                b,
                n,
                cache.stats.hit_rate,
                total / n,
                sum(share) / n,
                reused / n,
                (total - reused) / n,
                (sum(share) - reused) / n,
            ]
        )
    return pd.DataFrame(rows, columns=COLUMNS)
