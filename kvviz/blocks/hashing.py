"""Chained block hashes: the key a paged engine's prefix cache finds a block of KV under.

A block's hash covers its own tokens *and* the hash of the block before it (vLLM's scheme), so two
requests share block ``j`` only if they agree on every token up to the end of that block — the KV
of a token depends on everything before it, so equal tokens after a different prefix are not the
same cache. Only full blocks are hashed: a partly filled last block is still being written.

    from kvviz.blocks.hashing import block_hashes
    block_hashes([1, 2, 3, 4, 5, 6], block_size=4)   # one hash: the last 2 tokens are not a full block

The seed is fixed, so hashes are the same in every process (a cache could be shared between
workers or saved); ``extra`` salts every block (a LoRA name, a tenant) where KV would differ.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

SEED = hashlib.sha256(b"kvviz prefix cache v1").digest()  # the parent of every first block
MAX_BLOCK_SIZE = 4096


def check_block_size(block_size: int) -> int:
    """``block_size`` as a positive whole number of tokens (refuses booleans, fractions, huge values)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block size must be a whole number of tokens in 1 … {MAX_BLOCK_SIZE:,}; got {block_size!r}.")
    return block_size


class BlockHasher:
    """Hashes full blocks of ``block_size`` tokens, each chained to its parent's hash (SHA-256)."""

    def __init__(self, block_size: int, extra: str | None = None):
        self.block_size = check_block_size(block_size)
        self.extra = (extra or "").encode("utf-8")

    def hash_block(self, parent: bytes | None, tokens: Sequence[int]) -> bytes:
        """The hash of one full block whose predecessor hashed to ``parent`` (None: the first block)."""
        if len(tokens) != self.block_size:
            raise ValueError(f"a block holds exactly {self.block_size} tokens; got {len(tokens)}.")
        h = hashlib.sha256(parent or SEED)
        # fixed-width token ids: [1, 23] and [12, 3] must not hash alike
        h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens))
        h.update(len(self.extra).to_bytes(4, "little") + self.extra)
        return h.digest()

    def __call__(self, token_ids: Sequence[int], parent: bytes | None = None) -> list[bytes]:
        """Hashes of every full block of ``token_ids`` (continuing after ``parent`` when given)."""
        out: list[bytes] = []
        b = self.block_size
        for start in range(0, len(token_ids) - b + 1, b):
            parent = self.hash_block(parent, token_ids[start : start + b])
            out.append(parent)
        return out


def block_hashes(token_ids: Sequence[int], block_size: int, extra: str | None = None) -> list[bytes]:
    """Chained hashes of the full blocks of ``token_ids`` (see :class:`BlockHasher`)."""
    return BlockHasher(block_size, extra)(token_ids)


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix every sequence starts with."""
    if not sequences:
        return 0
    n = min(len(s) for s in sequences)
    first = sequences[0]
    for i in range(n):
        if any(s[i] != first[i] for s in sequences[1:]):
            return i
    return n
