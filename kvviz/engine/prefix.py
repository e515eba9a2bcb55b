"""The engine's prefix cache: a prompt's leading blocks of KV — and what the recorder saw there — reused.

Every student's chat request starts with the same template and system prompt, and a room pressing
one example sends the same prompt many times. A block of ``block_size`` prompt tokens is stored under
its chained hash (:mod:`kvviz.blocks.hashing`) in a byte-bounded LRU :class:`~kvviz.blocks.prefix_cache.PrefixCache`
with every layer's keys and values for those tokens and the attention probability rows of its
queries (a query of the prefix attends only to the prefix, so its rows are the same in every
request that shares it). A new request takes the longest run of cached leading blocks: their keys and
values go into its cache, their rows are folded into its recorder as its own prefill would have
folded them (:meth:`~kvviz.capture.recorder.Recorder.replay_prefix`), and its prefill starts after
them. Its Trace says how many prompt tokens came from the cache.

Blocks are :data:`BLOCK_SIZE` tokens, finer than vLLM's 16: a block is reused only when it is full and
every token up to its end matches, so 16-token blocks would hold 16 of the 24 tokens of SmolLM2's chat
template and system prompt, and every student's request would compute the other 8 again (~180 of a
room of 24's ~480 prompt rows). Much smaller blocks would also match the first words of questions that
begin alike ("What is"), and the run that computes such a block first holds the others back a step.

The prompt's last token is always computed (its logits give the first new token), and rows are
kept for at most ``max_tokens`` prompt tokens (they grow with the square of the prefix).

Each block remembers who used it — the sessions that stored it or found it cached, or the server itself
(the warm-up, the show-me examples) — up to the two needed to call it shared: a public blocks view
(:meth:`PrefixStore.blocks` with ``viewer``) shows the text of a block only when the server used it, two
sessions did, or the viewer did, so one student never reads another's prompt (the chat template and
system prompt every request starts with stay readable). Hidden blocks' hashes are shown through a key
only this store knows: the chained hash of a guessed prompt cannot be compared with them offline.

The engine's thread claims, stores and releases while the blocks view reads :meth:`PrefixStore.blocks`
from request threads, so every touch of the cache's bookkeeping holds the store's lock; tensor work on
blocks a run has pinned (no one evicts or changes them) happens outside it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import torch

from kvviz.blocks.hashing import BlockHasher
from kvviz.blocks.prefix_cache import CachedBlock, PrefixCache
from kvviz.capture.generation import Generation

BLOCK_SIZE = 8  # tokens per cached block (see the module docstring)
SERVER = None  # the owner of the server's own runs (warm-up, examples): their blocks are anyone's to read
SHARED = 2  # owners that make a block shared: more are not remembered (a template block has every session)


@dataclass
class Block:
    """One cached block's payload: keys and values per layer ([1, Hkv, B, D] each) and its queries'
    probability rows [Lyr, Hq, B, end] over keys ``0 … end-1`` (end = the block's last position + 1)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    rows: torch.Tensor
    token_ids: tuple[int, ...] = ()  # the block's prompt tokens, so the blocks view can show their text
    parent: bytes | None = None  # hash of the block before it (None: the prompt's first block)
    start: int = 0  # position of its first token
    owners: set[str | None] = field(default_factory=set)  # who used it, up to SHARED (SERVER: public)

    def own(self, owners: Iterable[str | None]) -> None:
        """Remember these owners too (with the store's lock held), while they can still change the verdict."""
        for owner in owners:
            if SERVER in self.owners or len(self.owners) >= SHARED:
                return
            self.owners.add(owner)


@dataclass(frozen=True)
class BlockInfo:
    """One cached block as the blocks view shows it: plain values, no tensors, safe to keep."""

    block_hash: str  # hex of the chained hash
    parent: str | None  # hex of the block it chains after; None for a prompt's first block
    start: int
    token_ids: tuple[int, ...]
    ref_count: int  # running requests that hold it (it cannot be evicted while > 0)
    hits: int  # times a request found it cached
    nbytes: int
    owners: frozenset = frozenset()  # who used it, up to SHARED (SERVER: the server itself)
    hidden: bool = False  # its text and hash withheld from this viewer (another session's prompt)

    def readable_by(self, viewer: str | None) -> bool:
        """The server's block, a block two sessions used, or one the viewer used."""
        return SERVER in self.owners or len(self.owners) >= SHARED or viewer in self.owners


@dataclass(frozen=True)
class StoreView:
    """A consistent copy of the store: its blocks in eviction order (next victim first, blocks in use
    last) and its statistics (:meth:`PrefixStore.stats`)."""

    blocks: list[BlockInfo] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


@dataclass
class Claim:
    """What one run holds in the store: the blocks it pinned, the hashes of those it will insert."""

    held: list[CachedBlock]
    hashes: list[bytes]


class PrefixStore:
    """Blocks of prompt KV and attention rows by chained hash (see the module docstring)."""

    def __init__(self, capacity_bytes: int, block_size: int = BLOCK_SIZE, max_tokens: int = 256, salt: str = ""):
        self.cache = PrefixCache(capacity_bytes)
        self.hasher = BlockHasher(block_size, salt)
        self.block_size, self.max_tokens = block_size, max_tokens
        self.lock = threading.Lock()
        self._key = os.urandom(32)  # hashes a public view shows are keyed with it (see the module docstring)

    def hashes(self, g: Generation) -> list[bytes]:
        """The chained hashes of the run's prompt blocks the store could hold (none for a run it cannot seed,
        or when the store may hold no bytes: no run then waits for blocks another is computing)."""
        usable = min(g.trace.n_prompt - 1, self.max_tokens) // self.block_size * self.block_size
        if usable <= 0 or not g.default_cache or g.rec is None or self.cache.capacity_bytes <= 0:
            return []
        return self.hasher(g.trace.token_ids[:usable])

    def claim(
        self, g: Generation, hashes: list[bytes] | None = None, owners: Iterable[str | None] = (SERVER,)
    ) -> Claim:
        """Seed a fresh run from the longest cached run of its leading blocks, and ask its recorder to keep
        the rows of the blocks still to be stored. Call before the run's first forward; ``hashes``: the
        run's :meth:`hashes`, when the caller has them already; ``owners``: who sent the run."""
        b = self.block_size
        hashes = self.hashes(g) if hashes is None else hashes
        if not hashes or g.rec is None:
            return Claim([], [])
        usable = len(hashes) * b
        with self.lock:
            held = self.cache.acquire(hashes)
            for block in held:
                block.payload.own(owners)
        if held:
            blocks = [h.payload for h in held]
            layers = [
                (torch.cat([blk.kv[i][0] for blk in blocks], dim=2), torch.cat([blk.kv[i][1] for blk in blocks], dim=2))
                for i in range(len(blocks[0].kv))
            ]
            p = len(held) * b
            rows = torch.zeros(*blocks[0].rows.shape[:2], p, p, device=blocks[0].rows.device)
            for j, blk in enumerate(blocks):
                rows[:, :, j * b : (j + 1) * b, : blk.rows.shape[3]] = blk.rows
            g.restore_prefix(layers, rows)
        if len(held) < len(hashes):
            g.rec.keep_prefix_rows(usable)
        return Claim(held, hashes)

    def store(self, g: Generation, claim: Claim, owners: Iterable[str | None] = (SERVER,)) -> None:
        """After the run's prefill: insert its blocks not yet cached (pinned for the run), then drop the
        recorder's copy of the rows; ``owners``: who sent the run."""
        if g.rec is None or g.rec.prefix_rows is None:
            return
        rows, b = g.rec.prefix_rows, self.block_size
        g.rec.prefix_rows = None
        ids = g.trace.token_ids
        for j in range(len(claim.held), len(claim.hashes)):
            start, end = j * b, (j + 1) * b
            kv = [(k[:, :, start:end].clone(), v[:, :, start:end].clone()) for k, v in _tensors(g.cache)]
            parent = claim.hashes[j - 1] if j else None
            payload = Block(kv, rows[:, :, start:end, :end].clone(), tuple(ids[start:end]), parent, start)
            nbytes = sum(k.nbytes + v.nbytes for k, v in kv) + payload.rows.nbytes
            with self.lock:
                block = self.cache.insert(claim.hashes[j], nbytes, payload)
                if block is not None:  # a block another run stored meanwhile keeps its owners and gains these
                    block.payload.own(owners)
            if block is None:  # no room: later blocks would be unreachable without this one
                break
            claim.held.append(block)

    def keep_turn(self, g: Generation, claim: Claim) -> None:
        """For a chat turn, before its first forward (after :meth:`claim`): ask the recorder to keep the rows
        of the blocks past the prompt's stored ones, up to the store's reach, so :meth:`store_turn` can
        store the finished turn's prompt and answer for the next turn to start from."""
        b = self.block_size
        start = len(claim.hashes) * b
        end = min(g.trace.n_prompt + g.max_new_tokens - 1, self.max_tokens) // b * b
        if g.rec is None or not g.default_cache or self.cache.capacity_bytes <= 0 or end <= start:
            return
        g.rec.keep_turn_rows(start, end)

    def store_turn(self, g: Generation, claim: Claim, owners: Iterable[str | None] = (SERVER,)) -> int:
        """After a chat turn's last step (its cache still held): insert the full blocks its cache holds past
        the prompt's — the rest of the prompt and the answer, up to the store's reach — chained after the
        prompt's blocks, pinned for the run like them. The tokens the store then holds for this turn."""
        b = self.block_size
        rec = g.rec
        if rec is None or rec.turn_rows is None or len(claim.held) < len(claim.hashes):  # a block found no room
            return len(claim.held) * b
        rows, s = rec.turn_rows, rec.turn_start
        rec.turn_rows = None
        ids = g.trace.token_ids[: min(g.fed, s + rows.shape[2]) // b * b]  # the cache holds g.fed tokens
        hashes = self.hasher(ids)
        for j in range(len(claim.hashes), len(hashes)):
            start, end = j * b, (j + 1) * b
            kv = [(k[:, :, start:end].clone(), v[:, :, start:end].clone()) for k, v in _tensors(g.cache)]
            parent = hashes[j - 1] if j else None
            payload = Block(kv, rows[:, :, start - s : end - s, :end].clone(), tuple(ids[start:end]), parent, start)
            nbytes = sum(k.nbytes + v.nbytes for k, v in kv) + payload.rows.nbytes
            with self.lock:
                block = self.cache.insert(hashes[j], nbytes, payload)
                if block is not None:
                    block.payload.own(owners)
            if block is None:
                break
            claim.held.append(block)
            claim.hashes.append(hashes[j])
        return len(claim.held) * b

    def held_tokens(self, token_ids: list[int]) -> int:
        """How many leading tokens of ``token_ids`` the store holds now, in whole blocks (no side effects)."""
        hashes = self.hasher(token_ids[: self.max_tokens // self.block_size * self.block_size])
        with self.lock:
            return self.cache.match(hashes) * self.block_size

    def own(self, hashes: Iterable[bytes], owner: str | None) -> None:
        """``owner`` sent a prompt with these blocks too (a request that joined an identical run)."""
        with self.lock:
            for h in hashes:
                block = self.cache.get(h)
                if block is not None:
                    block.payload.own([owner])

    def release(self, claim: Claim) -> None:
        """The run is over: its blocks stay cached until the byte budget needs their room."""
        with self.lock:
            self.cache.release(claim.held)
        claim.held = []

    def blocks(self, viewer: str | None = None, private: bool = False) -> StoreView:
        """Every cached block (eviction order) with its statistics, copied under the lock: the engine's
        thread may be inserting or evicting meanwhile. No tensor is touched. ``private`` (a public
        deployment): a block ``viewer`` may not read (:meth:`BlockInfo.readable_by`) comes without its
        tokens, and every hash is shown keyed (see the module docstring)."""
        with self.lock:
            blocks = [
                BlockInfo(
                    c.block_hash.hex(),
                    None if c.payload.parent is None else c.payload.parent.hex(),
                    c.payload.start,
                    c.payload.token_ids,
                    c.ref_count,
                    c.hits,
                    c.nbytes,
                    frozenset(c.payload.owners),
                )
                for c in self.cache.eviction_order()
            ]
            stats = self._stats()
        if private:
            blocks = [self._as_seen(b, viewer) for b in blocks]
        return StoreView(blocks, stats)

    def _as_seen(self, block: BlockInfo, viewer: str | None) -> BlockInfo:
        keyed = None if block.parent is None else self._keyed(block.parent)
        if block.readable_by(viewer):
            return replace(block, block_hash=self._keyed(block.block_hash), parent=keyed, owners=frozenset())
        return replace(
            block, block_hash=self._keyed(block.block_hash), parent=keyed, token_ids=(), owners=frozenset(), hidden=True
        )

    def _keyed(self, block_hash: str) -> str:
        return hashlib.blake2b(bytes.fromhex(block_hash), key=self._key, digest_size=16).hexdigest()

    def stats(self) -> dict:
        """Hit rate, blocks and bytes held (for logs, the blocks view and the load bench)."""
        with self.lock:
            return self._stats()

    def _stats(self) -> dict:
        s = self.cache.stats
        return {
            "block_size": self.block_size,
            "blocks": len(self.cache),
            "bytes_held": self.cache.used_bytes,
            "capacity_bytes": self.cache.capacity_bytes,
            "requests": s.requests,
            "queried_blocks": s.queried_blocks,
            "hit_blocks": s.hit_blocks,
            "hit_rate": s.hit_rate,
            "inserted_blocks": s.inserted_blocks,
            "evicted_blocks": s.evicted_blocks,
            "evicted_bytes": s.evicted_bytes,
            "refused_blocks": s.refused_blocks,
        }


def _tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's stored keys and values ([1, Hkv, T, D]) of a default (dynamic) cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]
