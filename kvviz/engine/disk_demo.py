"""The prefix store's disk tier made visible: a store with room in memory for one prompt, so blocks spill.

The engine's store holds 256 MiB in memory, and a lecture never fills it: nothing is evicted, so nothing
reaches the disk tier. :func:`spill_demo` runs a store of its own (the engine's is not touched) whose memory
holds one prompt's blocks, on a disk tier in a fresh temporary folder: prompt A is computed, B and C push
A's blocks out of memory onto disk, and A again reads them back from disk instead of computing them. It
records, after each request, where that request's prompt came from and what each tier holds.

    from kvviz.engine.disk_demo import spill_demo
    demo = spill_demo(lm)            # four one-token requests on the bundled model, a few seconds on a CPU
    demo.steps[-1].sources.disk      # prompt tokens of A's second request read back from disk
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace

from kvviz.capture.model_io import encode_prompt, model_info
from kvviz.engine.disk_tier import DiskTier
from kvviz.engine.prefix import PrefixStore, RequestSources
from kvviz.engine.side_channel import first_token_s
from kvviz.examples import chapter_text
from kvviz.models import LoadedModel

PROMPT_TOKENS = 64  # each prompt: 7 full blocks of 8 tokens (the last token is always computed)
MEMORY_BLOCKS = 8  # the demo store's memory: one prompt's blocks and one more
DISK_BYTES = 64 * 2**20
ORDER = ("A", "B", "C", "A")  # B and C push A out of memory; A comes back from disk


@dataclass(frozen=True)
class SpillStep:
    """One request of the demo and the store right after it."""

    prompt: str  # "A", "B" or "C"
    sources: RequestSources  # its prompt tokens: computed, memory hits, disk hits
    memory_blocks: int
    memory_bytes: int
    disk_blocks: int
    disk_bytes: int
    evicted_blocks: int  # evicted from memory so far (each written to disk)


@dataclass(frozen=True)
class SpillDemo:
    """Every step and the store's sizes (plain values: a show-me result stored on disk)."""

    steps: tuple[SpillStep, ...]
    block_bytes: int  # one block of keys and values (every layer), as stored
    memory_capacity: int
    disk_capacity: int


def spill_demo(lm: LoadedModel, prompt_tokens: int = PROMPT_TOKENS) -> SpillDemo:
    """Run :data:`ORDER` through a small store with a disk tier (see the module docstring)."""
    ids = encode_prompt(lm, chapter_text(), False)
    if len(ids) < 3 * prompt_tokens:
        raise ValueError(f"The chapter is too short for three prompts of {prompt_tokens} tokens.")
    prompts = {name: ids[i * prompt_tokens : (i + 1) * prompt_tokens] for i, name in enumerate("ABC")}
    block_bytes = PrefixStore(0).block_size * model_info(lm).kv_bytes_per_token  # keys and values, every layer
    memory = MEMORY_BLOCKS * block_bytes
    steps = []
    with tempfile.TemporaryDirectory(prefix="kvviz-disk-demo-") as folder:
        disk = DiskTier(folder, DISK_BYTES)
        store = PrefixStore(memory, salt=f"{lm.name}:{lm.dtype}", disk=disk)
        try:
            for name in ORDER:
                first_token_s(lm, store, prompts[name])
                view = store.blocks()
                s = view.stats
                steps.append(
                    SpillStep(
                        name,
                        replace(view.requests[-1], owners=frozenset()),
                        s["blocks"],
                        s["bytes_held"],
                        s.get("disk_blocks", 0),
                        s.get("disk_bytes", 0),
                        s["evicted_blocks"],
                    )
                )
        finally:
            store.close()
    return SpillDemo(tuple(steps), block_bytes, memory, DISK_BYTES)
