"""The prefix store's second tier: blocks the in-memory cache evicts, kept on disk until its bytes run out.

A serving engine's memory holds a few hundred blocks; a disk holds thousands. A block evicted from
memory (:class:`~kvviz.blocks.prefix_cache.PrefixCache`) is written here instead of being lost, and a
later request that needs it reads it back instead of recomputing its prefill — slower than a memory hit,
much faster than the prefill for a long prompt. The files are bounded in bytes and evicted least
recently used first, like the memory tier.

A file holds tensors only, written and read with ``safetensors`` (never pickle), named by the block's
chained hash inside a fresh folder only this process writes (mode 0700, made under the cache folder at
the first spill and deleted when the tier is dropped; a folder that cannot be written leaves the tier
empty, and evicted blocks are then simply gone, as without it). What a block means (its tokens, its parent, who used it)
stays in memory with an HMAC of the file's bytes, keyed by a secret that never leaves the process: a
block is read back only when this tier wrote it, and the bytes read are the bytes it wrote. A file that
was changed, replaced or planted is refused, deleted, and the block is computed again; a file this tier
holds no record of is never opened.

    tier = DiskTier(cache_folder / "prefix-blocks", capacity_bytes=512 * 2**20)
    tier.put(block_hash, {"k.0": k0, "v.0": v0}, meta)    # False when it cannot fit
    tensors, meta = tier.take(block_hash) or (None, None)  # the file is gone after a take
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

SUFFIX = ".safetensors"


def block_tensors(kv: list[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """A prefix block's tensors by name, as its file holds them: keys and values per layer, its rows if any."""
    tensors = {f"{name}.{i}": t for i, pair in enumerate(kv) for name, t in zip("kv", pair)}
    return tensors if rows is None else {**tensors, "rows": rows}


def block_layers(
    tensors: dict[str, torch.Tensor], layers: int, device: torch.device | str
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]:
    """:func:`block_tensors` back: keys and values per layer and the rows (None if it had none), on ``device``."""
    kv = [(tensors[f"k.{i}"].to(device), tensors[f"v.{i}"].to(device)) for i in range(layers)]
    return kv, tensors["rows"].to(device) if "rows" in tensors else None


def spill(tier: DiskTier, blocks: list) -> None:
    """Write prefix blocks the memory tier evicted (:class:`~kvviz.blocks.prefix_cache.CachedBlock`, their
    payload a prefix store's block) to ``tier``: the tensors to the file, what they mean to the index."""
    for c in blocks:
        p = c.payload
        meta = {
            "token_ids": p.token_ids,
            "parent": p.parent,
            "start": p.start,
            "owners": frozenset(p.owners),
            "layers": len(p.kv),
            "device": p.kv[0][0].device,
        }
        tier.put(c.block_hash, block_tensors(p.kv, p.rows), meta)


@dataclass
class _Entry:
    nbytes: int
    digest: bytes  # HMAC-SHA256 of the block hash and the file's bytes, with the tier's secret
    meta: Any  # what the block means, kept in memory: a file holds only tensors


@dataclass
class DiskStats:
    """What the tier did, in blocks and bytes."""

    written_blocks: int = 0
    written_bytes: int = 0
    read_blocks: int = 0
    evicted_blocks: int = 0
    evicted_bytes: int = 0
    too_big_blocks: int = 0  # blocks larger than the whole tier
    write_errors: int = 0  # writes the folder refused (a read-only or full disk): those blocks are dropped
    refused_files: int = 0  # files whose bytes were not the ones written (or were gone): recomputed


class DiskTier:
    """Evicted prefix blocks as safetensors files, at most ``capacity_bytes`` in all (see the module docstring)."""

    def __init__(self, folder: str | Path, capacity_bytes: int):
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"capacity must be a whole number of bytes ≥ 0; got {capacity_bytes!r}.")
        self.parent = Path(folder)
        self._folder: Path | None = None  # made at the first write
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.stats = DiskStats()
        self._secret = os.urandom(32)
        self._index: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently written first
        self._lock = threading.Lock()
        self._cleanup: weakref.finalize | None = None

    @property
    def folder(self) -> Path:
        """This tier's own folder (0700, a fresh name under the cache folder), made on first use."""
        if self._folder is None:
            self.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=self.parent))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._folder), True)
        return self._folder

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._index

    def path(self, block_hash: bytes) -> Path:
        """Where the block's file is (named by its hash, nothing a request chose)."""
        return self.folder / (block_hash.hex() + SUFFIX)

    def _digest(self, block_hash: bytes, data: bytes) -> bytes:
        return hmac.new(self._secret, block_hash + data, hashlib.sha256).digest()

    def put(self, block_hash: bytes, tensors: dict[str, torch.Tensor], meta: Any = None) -> bool:
        """Write one block (its tensors, moved to the CPU), evicting the least recently written files to make
        room; False when it is larger than the whole tier. A block already held is only marked recent."""
        data = save_tensors({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()})
        n = len(data)
        with self._lock:
            if block_hash in self._index:
                self._index.move_to_end(block_hash)
                return True
            if n > self.capacity_bytes:
                self.stats.too_big_blocks += 1
                return False
            while self.used_bytes + n > self.capacity_bytes:
                victim, entry = self._index.popitem(last=False)
                self.path(victim).unlink(missing_ok=True)
                self.used_bytes -= entry.nbytes
                self.stats.evicted_blocks += 1
                self.stats.evicted_bytes += entry.nbytes
            try:
                target = self.path(block_hash)
                partial = target.with_suffix(".partial")
                partial.write_bytes(data)
                os.replace(partial, target)
            except OSError:
                self.stats.write_errors += 1
                return False
            self._index[block_hash] = _Entry(n, self._digest(block_hash, data), meta)
            self.used_bytes += n
            self.stats.written_blocks += 1
            self.stats.written_bytes += n
        return True

    def take(self, block_hash: bytes, device: torch.device | str = "cpu") -> tuple[dict[str, torch.Tensor], Any] | None:
        """The block's tensors (on ``device``) and meta, removed from the tier (the caller keeps it in memory
        now); None when the tier holds no such block or its file is not the one written (deleted, refused)."""
        with self._lock:
            entry = self._index.pop(block_hash, None)
            if entry is None:
                return None  # a file this tier did not write is never opened
            self.used_bytes -= entry.nbytes
            target = self.path(block_hash)
            try:
                with open(target, "rb") as fh:
                    data = fh.read(entry.nbytes + 1)
            except OSError:
                data = b""
            target.unlink(missing_ok=True)
            if len(data) != entry.nbytes or not hmac.compare_digest(self._digest(block_hash, data), entry.digest):
                self.stats.refused_files += 1
                return None
            self.stats.read_blocks += 1
        tensors = load_tensors(data)
        return {k: v.to(device) for k, v in tensors.items()}, entry.meta

    def snapshot(self) -> dict:
        """Blocks and bytes held and what the tier did (for the blocks view and the benches)."""
        with self._lock:
            return {
                "disk_blocks": len(self._index),
                "disk_bytes": self.used_bytes,
                "disk_capacity_bytes": self.capacity_bytes,
                **{f"disk_{k}": v for k, v in vars(self.stats).items()},
            }

    def close(self) -> None:
        """Delete the tier's folder and forget its blocks."""
        with self._lock:
            self._index.clear()
            self.used_bytes = 0
            if self._cleanup is not None:
                self._cleanup()
            self._folder = None
