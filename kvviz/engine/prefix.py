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

Blocks evicted from memory spill to a bounded :class:`~kvviz.engine.disk_tier.DiskTier` when the store has
one, and come back on a hit: each prompt token of a run is labelled computed, memory hit or disk hit in its
Trace (``prompt_sources``). A run without a recorder (``record=False``) stores and reuses keys and values
only, under hashes of their own (a recorded run needs the rows too), and for its whole prompt: rows are
what grows with the square of the prefix.

A shared cache tells a second user, by its time to first token, whether someone already sent the same
prefix. ``session_salt`` closes that channel (vLLM's ``cache_salt``): each session's blocks are hashed
with a salt of its own, so sessions never share a block (the server's own runs stay unsalted).

The engine's thread claims, stores and releases while the blocks view reads :meth:`PrefixStore.blocks`
from request threads, so every touch of the cache's bookkeeping holds the store's lock; tensor work on
blocks a run has pinned (no one evicts or changes them) happens outside it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import torch

from kvviz.blocks.hashing import BlockHasher
from kvviz.blocks.prefix_cache import CachedBlock
from kvviz.capture.generation import Generation
from kvviz.engine.disk_tier import DiskTier, block_layers, spill
from kvviz.engine.kv_events import LoggedCache, to_jsonl

BLOCK_SIZE = 8  # tokens per cached block (see the module docstring)
SERVER = None  # the owner of the server's own runs (warm-up, examples): their blocks are anyone's to read
SHARED = 2  # owners that make a block shared: more are not remembered (a template block has every session)
COMPUTED, MEMORY, DISK = "computed", "memory", "disk"  # where a prompt token's keys and values came from
RECENT = 24  # requests whose sources the blocks view shows (a room's wave)


@dataclass
class Block:
    """One cached block's payload: keys and values per layer ([1, Hkv, B, D] each) and its queries'
    probability rows [Lyr, Hq, B, end] over keys ``0 … end-1`` (end = the block's last position + 1)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    rows: torch.Tensor | None  # None: a block of keys and values only (stored by a run without a recorder)
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
class RequestSources:
    """Where one request's prompt tokens came from: computed, the memory tier, the disk tier."""

    number: int  # the store's count of requests, from 1
    computed: int
    memory: int
    disk: int
    owners: frozenset = frozenset()  # who sent it (withheld from a public view)


@dataclass(frozen=True)
class StoreView:
    """A consistent copy of the store: its blocks in eviction order (next victim first, blocks in use
    last) and its statistics (:meth:`PrefixStore.stats`)."""

    blocks: list[BlockInfo] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    requests: list[RequestSources] = field(default_factory=list)  # the latest RECENT, oldest first


@dataclass
class Claim:
    """What one run holds in the store: the blocks it pinned, the hashes of those it will insert."""

    held: list[CachedBlock]
    hashes: list[bytes]


class PrefixStore:
    """Blocks of prompt KV and attention rows by chained hash (see the module docstring)."""

    def __init__(
        self,
        capacity_bytes: int,
        block_size: int = BLOCK_SIZE,
        max_tokens: int = 256,
        salt: str = "",
        disk: DiskTier | None = None,
        session_salt: bool = False,
    ):
        self._spill: list[CachedBlock] = []  # evicted under the lock, written to disk after it
        self.cache = LoggedCache(capacity_bytes, on_evict=None if disk is None else self._spill.append)
        self.salt, self.hasher = salt, BlockHasher(block_size, salt)
        self.block_size, self.max_tokens = block_size, max_tokens
        self.disk, self.session_salt = disk, session_salt
        self.lock = threading.Lock()
        self._key = os.urandom(32)  # hashes a public view shows are keyed with it (see the module docstring)
        self.disk_hit_blocks = 0
        self._requests: deque[RequestSources] = deque(maxlen=RECENT)
        self._n_requests = 0
        self.source_tokens = {COMPUTED: 0, MEMORY: 0, DISK: 0}  # prompt tokens of every request, by source

    def _hasher(self, g: Generation, owner: str | None) -> BlockHasher:
        """The hasher of this run's blocks: keys-and-values-only blocks and a salted session's apart."""
        return self.hasher_for(owner, kv_only=g.rec is None)

    def hasher_for(self, owner: str | None, kv_only: bool = False) -> BlockHasher:
        """The hasher of ``owner``'s blocks (salted per session when sessions are; ``kv_only``: a run without
        a recorder's blocks, which hold no rows)."""
        extra = self.salt + ("\x00kv-only" if kv_only else "")
        if self.session_salt and owner is not None:  # the server's own runs stay unsalted
            extra += "\x00session:" + hmac.new(self._key, owner.encode("utf-8"), hashlib.sha256).hexdigest()
        return self.hasher if extra == self.salt else BlockHasher(self.block_size, extra)

    def hashes(self, g: Generation, owner: str | None = SERVER) -> list[bytes]:
        """The chained hashes of the run's prompt blocks the store could hold (none for a run it cannot seed,
        or when the store may hold no bytes: no run then waits for blocks another is computing); ``owner``:
        who sent it (its salt, when sessions are salted)."""
        n = g.trace.n_prompt - 1 if g.rec is None else min(g.trace.n_prompt - 1, self.max_tokens)
        usable = n // self.block_size * self.block_size
        if usable <= 0 or not g.default_cache or self.cache.capacity_bytes <= 0:
            return []
        return self._hasher(g, owner)(g.trace.token_ids[:usable])

    def claim(
        self, g: Generation, hashes: list[bytes] | None = None, owners: Iterable[str | None] = (SERVER,)
    ) -> Claim:
        """Seed a fresh run from the longest cached run of its leading blocks, and ask its recorder to keep
        the rows of the blocks still to be stored. Call before the run's first forward; ``hashes``: the
        run's :meth:`hashes`, when the caller has them already; ``owners``: who sent the run."""
        b, owners = self.block_size, list(owners)
        hashes = self.hashes(g, owners[0] if owners else SERVER) if hashes is None else hashes
        if not hashes:
            return Claim([], [])
        usable = len(hashes) * b
        with self.lock:
            held = self.cache.acquire(hashes)
            for block in held:
                block.payload.own(owners)
        tiers = [MEMORY] * len(held)
        while self.disk is not None and len(held) < len(hashes):  # on from disk, then memory again, ...
            h = hashes[len(held)]
            with self.lock:
                found = self.cache.pin(h)
                if found is not None:
                    found.payload.own(owners)
            tier = MEMORY
            if found is None:
                found, tier = self._from_disk(h, owners), DISK
            if found is None:
                break
            held.append(found)
            tiers.append(tier)
        if held:
            blocks = [h.payload for h in held]
            layers = [
                (torch.cat([blk.kv[i][0] for blk in blocks], dim=2), torch.cat([blk.kv[i][1] for blk in blocks], dim=2))
                for i in range(len(blocks[0].kv))
            ]
            g.restore_prefix(layers, None if g.rec is None else _rows(blocks, b))
        if len(held) < len(hashes) and g.rec is not None:
            g.rec.keep_prefix_rows(usable)
        g.trace.prompt_sources = [t for t in tiers for _ in range(b)] + [COMPUTED] * (g.trace.n_prompt - len(held) * b)
        counts = g.trace.source_counts()
        with self.lock:
            self._n_requests += 1
            self.source_tokens = {k: v + counts[k] for k, v in self.source_tokens.items()}
            seen = RequestSources(self._n_requests, counts[COMPUTED], counts[MEMORY], counts[DISK], frozenset(owners))
            self._requests.append(seen)
        return Claim(held, hashes)

    def _from_disk(self, block_hash: bytes, owners: list[str | None]) -> CachedBlock | None:
        """The block read back from the disk tier into memory (pinned for the run), or None."""
        assert self.disk is not None
        got = self.disk.take(block_hash)
        if got is None:
            return None
        tensors, meta = got
        kv, rows = block_layers(tensors, meta["layers"], meta["device"])
        payload = Block(kv, rows, meta["token_ids"], meta["parent"], meta["start"], set(meta["owners"]))
        with self.lock:
            block = self.cache.insert(block_hash, block_nbytes(payload), payload)
            if block is not None:
                block.hits += 1
                block.payload.own(owners)
                self.disk_hit_blocks += 1
        if block is None:  # no room in memory now: it stays on disk
            self.disk.put(block_hash, tensors, meta)
        return block

    def flush(self) -> None:
        """Write the blocks evicted from memory to the disk tier (outside the lock: file work is slow; after a
        run's prefill, not before it: a run's time to first token waits for no one else's blocks)."""
        with self.lock:
            victims = self._spill[:]  # the cache appends to this very list: emptied, never replaced
            self._spill.clear()
        if self.disk is not None:
            spill(self.disk, victims)

    def store(self, g: Generation, claim: Claim, owners: Iterable[str | None] = (SERVER,)) -> None:
        """After the run's prefill: insert its blocks not yet cached (pinned for the run), then drop the
        recorder's copy of the rows; ``owners``: who sent the run."""
        self.flush()  # blocks the claim's reads from disk pushed out of memory: written after the prefill
        if len(claim.held) >= len(claim.hashes) or (g.rec is not None and g.rec.prefix_rows is None):
            return
        rows, b = (None, self.block_size) if g.rec is None else (g.rec.prefix_rows, self.block_size)
        if g.rec is not None:
            g.rec.prefix_rows = None
        ids = g.trace.token_ids
        for j in range(len(claim.held), len(claim.hashes)):
            start, end = j * b, (j + 1) * b
            kv = [(k[:, :, start:end].clone(), v[:, :, start:end].clone()) for k, v in layer_kv(g.cache)]
            parent = claim.hashes[j - 1] if j else None
            payload = Block(
                kv, None if rows is None else rows[:, :, start:end, :end].clone(), tuple(ids[start:end]), parent, start
            )
            if not self.insert(claim.hashes[j], payload, owners, claim):
                break  # no room: later blocks would be unreachable without this one
        self.flush()

    def insert(self, block_hash: bytes, payload: Block, owners: Iterable[str | None], claim: Claim) -> bool:
        """Store one block for ``claim``'s run (pinned for it); False when the store has no room for it."""
        with self.lock:
            block = self.cache.insert(block_hash, block_nbytes(payload), payload)
            if block is not None:  # a block another run stored meanwhile keeps its owners and gains these
                block.payload.own(owners)
        if block is None:
            return False
        claim.held.append(block)
        if len(claim.hashes) < len(claim.held):  # a block past the prompt's (a chat turn's answer)
            claim.hashes.append(block_hash)
        return True

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
            requests = list(self._requests)
        if private:
            blocks = [self._as_seen(b, viewer) for b in blocks]
            mine = [r for r in requests if SERVER in r.owners or viewer in r.owners]
            requests = [replace(r, owners=frozenset()) for r in mine]
        return StoreView(blocks, stats, requests)

    def kv_events(self, viewer: str | None = None, private: bool = False) -> str:
        """The memory tier's changes in vLLM's KV event schema (kv_events.py); ``private``: as :meth:`blocks`."""
        seen = (lambda e: BlockInfo("", None, 0, (), 0, 0, 0, e.owners).readable_by(viewer)) if private else None
        return to_jsonl(self.cache.log.events(), self.block_size, self._keyed if private else None, seen)

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
            "disk_hit_blocks": self.disk_hit_blocks,
            "session_salt": self.session_salt,
            **({} if self.disk is None else self.disk.snapshot()),
        }

    def close(self) -> None:
        """Drop the disk tier's files and every cached block (the server is stopping)."""
        with self.lock:
            self.cache.clear()
        if self.disk is not None:
            self.disk.close()


def block_nbytes(block: Block) -> int:
    return sum(k.nbytes + v.nbytes for k, v in block.kv) + (0 if block.rows is None else block.rows.nbytes)


def _rows(blocks: list[Block], b: int) -> torch.Tensor:
    """The cached blocks' probability rows as one [Lyr, Hq, P, P] prefix (each block's rows end at its end)."""
    first = blocks[0].rows
    assert first is not None and all(blk.rows is not None for blk in blocks)
    p = len(blocks) * b
    rows = torch.zeros(*first.shape[:2], p, p, device=first.device)
    for j, blk in enumerate(blocks):
        assert blk.rows is not None
        rows[:, :, j * b : (j + 1) * b, : blk.rows.shape[3]] = blk.rows
    return rows


def layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's stored keys and values ([1, Hkv, T, D]) of a default (dynamic) cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]
