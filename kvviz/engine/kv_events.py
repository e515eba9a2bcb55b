"""The engine's prefix-cache changes as KV events in vLLM's schema, and the cached blocks rebuilt from such a log.

vLLM publishes its KV cache's changes (``vllm/distributed/kv_events.py``) as batches ``{"ts", "events"}`` of
``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``, ``medium``,
``lora_name``), ``BlockRemoved`` (``block_hashes``, ``medium``) and ``AllBlocksCleared``, each naming its kind in
``"type"`` (msgspec's tag). Routers read them to send a request where its prefix is cached; trace tools (AWS's
kvtrace, kvcache-simulator) replay them, never seeing token text. :class:`LoggedCache` records kvviz's prefix
cache (:class:`~kvviz.engine.prefix.PrefixStore`) the same way — a block stored in memory, a block evicted from
it, the store cleared — and :func:`replay` reads a log back (kvviz's own, or one vLLM wrote in that schema; JSON
Lines of batches or of bare events) into the blocks cached at its end, each under the block it chains after.

``medium`` "GPU" is vLLM's name for its primary cache; kvviz gives it to its in-memory tier wherever the model
runs (the CPU too). Hashes are kvviz's chained block hashes in hex; a log's hashes (vLLM writes integers or
bytes) are read as opaque keys. Past :data:`~kvviz.limits.MAX_KV_EVENTS` events the log folds itself into one
``AllBlocksCleared`` and a ``BlockStored`` per cached block, so replaying it still gives exactly the cache.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from kvviz.blocks.prefix_cache import CachedBlock, PrefixCache
from kvviz.limits import MAX_KV_EVENTS

MEDIUM = "GPU"  # vLLM's name for the primary KV cache: kvviz's memory tier
STORED, REMOVED, CLEARED = "BlockStored", "BlockRemoved", "AllBlocksCleared"


@dataclass(frozen=True)
class Event:
    """One change of the memory tier: ``hashes`` (hex) stored under ``parent``, removed, or all cleared."""

    kind: str
    ts: float
    hashes: tuple[str, ...] = ()
    parent: str | None = None
    token_ids: tuple[int, ...] = ()
    # who used the stored block: the block's own set, so later users count too (a private export; never written)
    owners: AbstractSet = frozenset()


class KVEventLog:
    """The memory tier's events, oldest first (thread-safe; see the module docstring for its bound)."""

    def __init__(self, limit: int = MAX_KV_EVENTS):
        self.limit = limit
        self._events: list[Event] = []
        self._lock = threading.Lock()

    def add(self, event: Event, current: Callable[[], Iterable[Event]] | None = None) -> None:
        with self._lock:
            self._events.append(event)
            if len(self._events) > self.limit and current is not None:
                self._events = [Event(CLEARED, time.time()), *current()]

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)


def _stored(block: CachedBlock) -> Event:
    p = block.payload
    parent = None if p.parent is None else p.parent.hex()
    return Event(STORED, time.time(), (block.block_hash.hex(),), parent, tuple(p.token_ids), p.owners)


def _start(block: CachedBlock) -> int:
    return block.payload.start


@dataclass
class LoggedCache(PrefixCache):
    """A :class:`PrefixCache` of the prefix store's blocks that writes each change to ``log``."""

    log: KVEventLog = field(default_factory=KVEventLog)

    def __post_init__(self) -> None:
        super().__post_init__()
        spill = self.on_evict

        def evicted(block: CachedBlock) -> None:
            self.log.add(Event(REMOVED, time.time(), (block.block_hash.hex(),)))
            if spill is not None:
                spill(block)

        self.on_evict = evicted

    def insert(self, block_hash: bytes, nbytes: int, payload: Any = None) -> CachedBlock | None:
        new = block_hash not in self
        block = super().insert(block_hash, nbytes, payload)
        if new and block is not None:
            self.log.add(_stored(block), lambda: [_stored(b) for b in sorted(self._blocks.values(), key=_start)])
        return block

    def clear(self) -> None:
        """Every block dropped (the store is closing)."""
        self._blocks.clear()
        self._free.clear()
        self.used_bytes = 0
        self.log.add(Event(CLEARED, time.time()))


def to_jsonl(
    events: Iterable[Event],
    block_size: int,
    key: Callable[[str], str] | None = None,
    readable: Callable[[Event], bool] | None = None,
) -> str:
    """One vLLM ``KVEventBatch`` per line. ``key``: hashes shown keyed; ``readable``: a stored block it refuses
    comes without its tokens (a public deployment: another session's prompt)."""
    shown = key or (lambda h: h)
    lines = []
    for e in events:
        if e.kind == STORED:
            tokens = list(e.token_ids) if readable is None or readable(e) else []
            body: dict = {
                "type": STORED,
                "block_hashes": [shown(h) for h in e.hashes],
                "parent_block_hash": None if e.parent is None else shown(e.parent),
                "token_ids": tokens,
                "block_size": block_size,
                "lora_id": None,
                "medium": MEDIUM,
                "lora_name": None,
            }
        elif e.kind == REMOVED:
            body = {"type": REMOVED, "block_hashes": [shown(h) for h in e.hashes], "medium": MEDIUM}
        else:
            body = {"type": CLEARED}
        lines.append(json.dumps({"ts": e.ts, "events": [body]}))
    return "".join(line + "\n" for line in lines)


@dataclass(frozen=True)
class ReplayedBlock:
    """One block cached at the end of a replayed log."""

    block_hash: str
    parent: str | None
    start: int
    token_ids: tuple[int, ...]


def _events(text: str) -> Iterable[dict]:
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"Line {n} of the event log is not JSON: {exc.msg}.") from None
        batch = item.get("events") if isinstance(item, dict) else None
        for event in batch if isinstance(batch, list) else [item]:
            if not isinstance(event, dict) or event.get("type") not in (STORED, REMOVED, CLEARED):
                raise ValueError(f"Line {n} of the event log holds no BlockStored, BlockRemoved or AllBlocksCleared.")
            yield event


def replay(text: str) -> list[ReplayedBlock]:
    """The blocks of the primary cache ("GPU", or no medium) at the end of a JSON Lines event log, in the order
    they were stored. A block's start is its parent's end when the log stored the parent, else 0."""
    cached: dict[str, ReplayedBlock] = {}
    ends: dict[str, int] = {}
    for event in _events(text):
        kind = event["type"]
        if kind == CLEARED:
            cached.clear()
            continue
        if str(event.get("medium") or MEDIUM).upper() != MEDIUM:
            continue
        hashes = [str(h) for h in event.get("block_hashes") or []]
        if kind == REMOVED:
            for h in hashes:
                cached.pop(h, None)
            continue
        size = int(event.get("block_size") or 0)
        tokens = [int(t) for t in event.get("token_ids") or []]
        parent = event.get("parent_block_hash")
        parent = None if parent is None else str(parent)
        for i, h in enumerate(hashes):
            chunk = tuple(tokens[i * size : (i + 1) * size]) if size else ()
            start = ends.get(parent, 0) if parent is not None else 0
            cached[h] = ReplayedBlock(h, parent, start, chunk)
            ends[h] = start + (size or len(chunk))
            parent = h
    return list(cached.values())
