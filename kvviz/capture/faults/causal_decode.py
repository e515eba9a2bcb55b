"""Decode with a causal mask on a single query: SDPA's ``is_causal=True`` aligns its mask to the top left, so
the one new query (the last position) sees only the first key."""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.capture.faults.base import Fault, sdpa


@dataclass(frozen=True)
class CausalDecode(Fault):
    name = "causal_decode"
    title = "decode with a causal mask"
    source = (
        "the chapter's code ('Note causal=False in decode'); PyTorch's scaled_dot_product_attention docs: "
        "is_causal uses the top-left causal alignment"
    )
    lesson = (
        "A single decode query passed to SDPA with is_causal=True sees only the first key (the mask is aligned "
        "top-left); decode with causal=False, or a mask aligned bottom-right."
    )
    shows = "K and V agree; the attention output of the struck layer jumps at the struck step, and every layer after it"
    first = "attention output"

    def attend(self, module, query, key, value, scaling, window=None):
        if query.shape[2] != 1:
            return None
        return sdpa(query, key, value, scaling, causal=True)  # [1, 1] ∧ tril → key 0 only
