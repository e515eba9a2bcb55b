"""A prefix-cache hit that maps the wrong block: the block table is off by one from ``block`` on, so the
sequence's block b holds the keys and values of block b − 1 (in every layer: one table serves them all)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from kvviz.capture.faults.base import Fault
from kvviz.capture.model_io import forward

BLOCK = 8  # tokens per block, as the engine's prefix cache stores them


def prefix_layers(g, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's keys and values ([1, Hkv, tokens, D]) of the prompt's first ``tokens`` tokens, computed
    from scratch — what another request left in the prefix cache."""
    cache = DynamicCache(config=g.lm.config)
    with torch.inference_mode():
        forward(g.lm, g.trace.token_ids[:tokens], 0, cache, None)
    out = []
    for layer in cache.layers:
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise ValueError("A prefix-cache fault needs keys and values in every layer (attention, not linear state).")
        out.append((k, v))
    return out


def restore(g, layers, fed: int | None = None) -> None:
    """Seed the run's cache with ``layers`` without counting a forward; the prefill then starts at ``fed``."""
    g.cache.restoring = True
    try:
        g.restore_prefix(layers, None)
    finally:
        g.cache.restoring = False
    if fed is not None:
        g.fed = fed


@dataclass(frozen=True)
class PrefixBlockOffByOne(Fault):
    block: int = 1  # the first block the table maps wrongly

    name = "prefix_block_off_by_one"
    title = "prefix cache maps the wrong block"
    source = "an off-by-one in a paged engine's block table on a prefix-cache hit (vLLM / nano-vllm block managers)"
    lesson = (
        "A hit that maps block b to the pages of block b − 1 hands the sequence fluent but wrong context; the "
        "table must be built from the same chained hashes that found the blocks."
    )
    shows = "step 0 (the prefill): layer 0's keys leave their tolerance at the wrong block's first position"
    first = "K"
    every_layer = True
    prefill = True

    def strikes(self, step: int, layer: int) -> bool:
        return False  # the damage is done when the blocks are restored

    def begin(self, g) -> None:
        blocks = (g.trace.n_prompt - 1) // BLOCK  # never the prompt's last token: it must be computed
        if not 1 <= self.block < blocks:
            raise ValueError(
                f"The prompt has {blocks} whole cacheable blocks of {BLOCK} tokens; the wrong block must be "
                f"between 1 and {blocks - 1}: use a longer prompt or an earlier block."
            )
        good = prefix_layers(g, blocks * BLOCK)
        table = [b if b < self.block else b - 1 for b in range(blocks)]  # logical block -> physical block
        idx = torch.cat([torch.arange(p * BLOCK, (p + 1) * BLOCK) for p in table]).to(good[0][0].device)
        restore(g, [(k[:, :, idx], v[:, :, idx]) for k, v in good])
