"""A prompt whose every block is a prefix-cache hit leaves nothing to prefill: the engine, which must still
produce the first token's logits, feeds the last prompt token again on top of its cached entry."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.capture.faults.base import Fault
from kvviz.capture.faults.prefix_block_off_by_one import BLOCK, prefix_layers, restore


@dataclass(frozen=True)
class FullyCachedPrompt(Fault):
    name = "fully_cached_prompt"
    title = "a fully cached prompt"
    source = "GeeeekExplorer/nano-vllm issue #114, fixed by PR #199 (a prompt of whole blocks, every block cached)"
    lesson = (
        "When every prompt block is a hit nothing is left to prefill; keep the last prompt token out of the "
        "cache hit (recompute it) so the first token has its own forward — kvviz's engine never restores it."
    )
    shows = "step 0: every layer's cache holds the last prompt token twice (cache length), from layer 0 on"
    first = "cache length"
    every_layer = True
    prefill = True
    step: int = 0

    def strikes(self, step: int, layer: int) -> bool:
        return False  # the damage is done when the blocks are restored

    def begin(self, g) -> None:
        n = g.trace.n_prompt
        if n % BLOCK:
            raise ValueError(
                f"A fully cached prompt is whole {BLOCK}-token blocks; this one has {n} tokens "
                f"(the debugger cuts it to {n - n % BLOCK})."
            )
        restore(g, prefix_layers(g, n), fed=n - 1)  # all n cached; the last token is fed again
