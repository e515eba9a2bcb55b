"""Sliding window without sinks: only the most recent tokens — the pitfall the chapter warns about.

Once the first tokens leave the window the model loses the place where it dumps spare attention,
and quality collapses (see the "Sinks matter" demo). Kept in every layer and head alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.eviction.policies.base import WINDOW, Policy, PolicyState, Selection
from kvviz.eviction.policies.streaming_llm import streaming_keep


@dataclass
class SlidingWindow(Policy):
    """The last ``n_kept`` tokens, nothing else."""

    name = "window"
    title = "Sliding window (no sinks)"
    paper = "The baseline StreamingLLM (Xiao et al. 2023) shows collapsing"
    summary = (
        "Keeps only the most recent tokens; the first tokens (attention sinks) leave the cache, "
        "which is what breaks the model."
    )
    evicts_while_decoding = True

    def select(self, state: PolicyState) -> Selection:
        keep = streaming_keep(state.positions, state.n_kept, 0)
        return Selection(keep=keep, roles=keep.new_full(keep.shape, WINDOW))
