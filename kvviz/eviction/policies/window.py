"""Sliding window without sinks: only the most recent tokens — the pitfall the chapter warns about.

Once the first tokens leave the window the model loses the place where it dumps spare attention,
and quality collapses (see the "Sinks matter" demo). Kept in every layer and head alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.eviction.policies.base import WINDOW, PolicyState
from kvviz.eviction.policies.scorer import ScorerPolicy, protect_ends


@dataclass
class SlidingWindow(ScorerPolicy):
    """The last ``n_kept`` tokens, nothing else."""

    name = "window"
    title = "Sliding window (no sinks)"
    paper = "The baseline StreamingLLM (Xiao et al. 2023) shows collapsing"
    summary = (
        "Keeps only the most recent tokens; the first tokens (attention sinks) leave the cache, "
        "which is what breaks the model."
    )
    evicts_while_decoding = True

    def protect(self, state: PolicyState) -> torch.Tensor:
        return protect_ends(state.positions.shape[-1], 0, WINDOW, state.n_kept, WINDOW, state.positions.device)
