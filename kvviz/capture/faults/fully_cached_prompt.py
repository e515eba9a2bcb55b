"""A prompt whose every block is a prefix-cache hit leaves nothing to prefill.

In nano-vllm the prefill then has zero queries and the attention kernel crashes (issue #114); the fix
(PR #199, "L-1") counts one token fewer as cached, so the last prompt token is fed again and its
keys and values overwrite its own slot. A crash draws no map, so kvviz shows that fix done wrong: the
last prompt token fed again and *appended* on top of its cached entry, in every layer."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.capture.faults.base import Fault
from kvviz.capture.faults.prefix_block_off_by_one import BLOCK, prefix_layers, restore


@dataclass(frozen=True)
class FullyCachedPrompt(Fault):
    name = "fully_cached_prompt"
    title = "a fully cached prompt"
    source = (
        "GeeeekExplorer/nano-vllm issue #114 (a prompt of whole blocks, every block cached: zero queries to "
        "prefill, a crash), fixed by PR #199 (recompute the last token, overwriting its slot)"
    )
    lesson = (
        "When every prompt block is a hit nothing is left to prefill; recompute the last prompt token into its "
        "own slot (never append it again) — kvviz's engine never restores the last prompt token at all."
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
        restore(g, prefix_layers(g, n), fed=n - 1)  # all n cached; the last token fed again, appended
