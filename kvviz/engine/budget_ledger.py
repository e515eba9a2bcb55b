"""How a KV budget is spent: the bytes each way of storing a sequence's cache holds, and the shared blocks.

A serving engine's KV memory is a fixed pool (vLLM's ``gpu_memory_utilization`` share after the weights).
How many sequences run at once depends on what each one takes from it:

- **contiguous** reserves a sequence's whole cache when it is admitted — its prompt plus
  ``max_new_tokens`` (``contiguous``), or the model's whole context, as a static cache does
  (``contiguous-context``) — so the reserved but empty part waits idle until the sequence ends;
- **paged** takes fixed-size blocks as the sequence grows (the last one partly empty);
- **paged+prefix** holds the full blocks of prompts that match — the room's chat template and system
  prompt — once, however many sequences read them (chained block hashes, :mod:`kvviz.blocks.hashing`);
- **paged+kivi2** stores what left KIVI's full-precision window as 2-bit integers with 16-bit scales,
  packed as a store holds them (:func:`kvviz.quant.schemes.stored_bytes`; the window at the model's own
  element size), in the same pool's blocks: a block holds a full-precision block's bytes, so packed
  entries fill it with about seven times as many tokens, and a sequence holds whole blocks (its last one
  partly empty), as the other paged modes do.

:class:`Ledger` says what a sequence of ``t`` cached tokens holds in a mode, and what the same entries
take as the cache tensors hold them (:meth:`Ledger.tensor_bytes`, read from the tensors' shapes and
element sizes), so a replay checks every step that the tensors fit inside what the ledger counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvviz.blocks.hashing import block_hashes
from kvviz.capture.trace import ModelInfo
from kvviz.quant.schemes import FULL_BYTES, QuantSpec, Scheme, kivi, quantized_prefix, stored_bytes

MODES = ("contiguous-context", "contiguous", "paged", "paged+prefix", "paged+kivi2")
LOSSY = ("paged+kivi2",)
PAGED = ("paged", "paged+prefix", "paged+kivi2")
BLOCK_TOKENS = 8  # tokens per block: the engine's prefix blocks (kvviz.engine.prefix.BLOCK_SIZE)


def kivi_scheme() -> Scheme:
    """The smaller cache: KIVI-2 with groups and a full-precision window of 16 tokens (a room's answers are
    short: KIVI's own 32/128 would leave them all in the window)."""
    return kivi(2, group_size=16, residual=16)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}.")
    return mode


@dataclass
class Split:
    """Where the bytes of a step went: reserved but empty (a contiguous reservation's unwritten tail, a block's
    unfilled slots), held (private entries at full precision), shared (prefix blocks held once), compressed
    (entries stored quantized, as packed)."""

    empty: int = 0
    held: int = 0
    shared: int = 0
    compressed: int = 0

    @property
    def total(self) -> int:
        return self.empty + self.held + self.shared + self.compressed


class Ledger:
    """The bytes one mode charges a sequence (see the module docstring). ``info``: the model's cache shape."""

    def __init__(self, info: ModelInfo, mode: str, block_tokens: int = BLOCK_TOKENS):
        self.mode, self.block = check_mode(mode), block_tokens
        self.layers, self.heads, self.dim = info.layers, info.kv_heads, info.head_dim
        self.element = info.bytes_per_element
        self.per_token = 2 * self.layers * self.heads * self.dim * self.element  # K and V, every layer
        self.context = info.context_length
        self.scheme = kivi_scheme() if mode == "paged+kivi2" else None

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block)

    def reserve(self, n_prompt: int, max_new: int) -> int:
        """Bytes a contiguous mode reserves at admission (0 for the paged ones, which reserve nothing)."""
        if self.mode == "contiguous":
            return (n_prompt + max_new) * self.per_token
        if self.mode == "contiguous-context":
            return max(self.context, n_prompt + max_new) * self.per_token
        return 0

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of the pool: ``block`` tokens at full precision."""
        return self.block * self.per_token

    def private(self, tokens: int) -> int:
        """Bytes a paged mode holds for a sequence's ``tokens`` private entries: whole blocks (KIVI: as many as
        its packed bytes fill)."""
        if self.scheme is not None:
            return -(-self._stored(tokens) // self.block_bytes) * self.block_bytes
        return self.blocks(tokens) * self.block_bytes

    def _stored(self, tokens: int) -> int:
        """KIVI's bytes for ``tokens`` entries of every layer: packed payload and scales, the window at the
        model's element size."""
        if self.scheme is None:
            raise RuntimeError("only the KIVI mode stores entries compressed.")
        total = 0
        for spec in (self.scheme.key, self.scheme.value):
            sb = stored_bytes((1, self.heads, tokens, self.dim), spec)
            total += sb.payload + sb.meta + sb.residual // FULL_BYTES * self.element
        return total * self.layers

    def compressed_part(self, tokens: int) -> int:
        """Of :meth:`private`, the bytes of the entries stored quantized (payload and scales)."""
        if self.scheme is None:
            return 0
        total = 0
        for spec in (self.scheme.key, self.scheme.value):
            sb = stored_bytes((1, self.heads, tokens, self.dim), spec)
            total += sb.payload + sb.meta
        return total * self.layers

    def quantized_tokens(self, tokens: int) -> int:
        """Of ``tokens`` entries, how many keys KIVI stores quantized (0 without it)."""
        if self.scheme is None:
            return 0
        spec: QuantSpec = self.scheme.key
        return quantized_prefix(tokens, spec)

    def peak(self, n_prompt: int, max_new: int) -> int:
        """The most a lone sequence of this length ever holds in this mode (a budget must hold one)."""
        if self.mode.startswith("contiguous"):
            return self.reserve(n_prompt, max_new)
        return max(self.private(t) for t in range(n_prompt, n_prompt + max_new + 1))

    def tensor_bytes(self, tokens: int, element: int) -> int:
        """What ``tokens`` entries of every layer take as a cache's tensors hold them, ``element`` bytes each
        (read from the tensors), stored as this mode stores them (KIVI: its packed bytes)."""
        if self.scheme is not None:
            return self._stored(tokens) // self.element * element
        return 2 * self.layers * self.heads * self.dim * element * tokens


@dataclass
class SharedBlock:
    """A prompt block held once: its token range's end, who reads it, and whether its keys and values exist yet."""

    end: int
    readers: set[int] = field(default_factory=set)
    computed_by: int | None = None  # the sequence whose cache holds it; None: not yet computed


class SharedPool:
    """The full prompt blocks every running sequence reads, by chained hash, each held once; a block is
    freed when its last reader leaves. A prompt's last token never goes in a block here (its logits give
    the first new token), as in the engine's prefix store."""

    def __init__(self, block_tokens: int, block_bytes: int):
        self.block, self.block_bytes = block_tokens, block_bytes
        self.blocks: dict[bytes, SharedBlock] = {}

    def hashes(self, prompt: Sequence[int]) -> list[bytes]:
        return block_hashes(list(prompt[:-1]), self.block)

    def hits(self, hashes: Sequence[bytes]) -> int:
        """Leading blocks of ``hashes`` held now, computed."""
        n = 0
        for h in hashes:
            b = self.blocks.get(h)
            if b is None or b.computed_by is None:
                break
            n += 1
        return n

    def pending(self, hashes: Sequence[bytes]) -> bool:
        """Whether a leading block is held but not yet computed (its sequence prefills in this step)."""
        n = self.hits(hashes)
        return n < len(hashes) and hashes[n] in self.blocks

    def new_bytes(self, hashes: Sequence[bytes]) -> int:
        return sum(self.block_bytes for h in hashes if h not in self.blocks)

    def take(self, seq: int, hashes: Sequence[bytes]) -> None:
        for i, h in enumerate(hashes):
            self.blocks.setdefault(h, SharedBlock((i + 1) * self.block)).readers.add(seq)

    def computed(self, seq: int, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            if self.blocks[h].computed_by is None:
                self.blocks[h].computed_by = seq

    def holder(self, h: bytes, running: set[int]) -> int | None:
        """A running reader whose cache holds the block (the one that computed it, else any reader that
        restored it — every reader's cache has it once it runs)."""
        b = self.blocks[h]
        if b.computed_by in running:
            return b.computed_by
        return next((r for r in sorted(b.readers) if r in running), None)

    def leave(self, seq: int, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            b = self.blocks.get(h)
            if b is None:
                continue
            b.readers.discard(seq)
            if b.computed_by == seq:
                b.computed_by = -1  # computed; its keys and values live on in its other readers' caches
            if not b.readers:
                del self.blocks[h]

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * self.block_bytes
