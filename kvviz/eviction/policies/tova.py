"""TOVA (Oren et al. 2024): the last query's attention, averaged over every head, decides for all of them.

"Transformers are Multi-State RNNs": keep the entries the newest token attends to most. kvpress's
``TOVAPress`` (0.5.5) scores each earlier prompt position with the last prompt query's attention
(softmax over every prompt key, itself included) averaged over all query heads of the layer, so
every KV head of a layer keeps the same set; the last token itself is always kept. Decided once
after the prefill (the original evicts one entry per generated token; kvpress and kvviz do not).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvviz.eviction.policies.base import WINDOW, PolicyState
from kvviz.eviction.policies.scorer import ScorerPolicy, protect_ends


def tova_scores(last_row: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[Lyr, Hq, L] last-query attention → [Lyr, Hkv, L − 1]: the mean over all query heads, repeated per KV head."""
    mean = last_row[..., :-1].mean(-2, keepdim=True)  # [Lyr, 1, L-1]
    return mean.repeat(1, kv_heads, 1)


@dataclass
class TOVA(ScorerPolicy):
    """One kept set per layer, shared by its KV heads, chosen by the newest token's attention."""

    name = "tova"
    title = "TOVA (last token's attention, all heads)"
    paper = "Oren et al. 2024, Transformers are Multi-State RNNs (TOVA: Token Omission Via Attention)"
    summary = (
        "The last prompt token's attention, averaged over every query head of a layer, scores the earlier "
        "tokens: every KV head of the layer keeps the same set (the last token always stays)."
    )
    score_label = "last prompt query's attention, mean over all query heads of the layer"
    needs_window_rows = True

    @property
    def observation_window(self) -> int:
        return 1

    def protect(self, state: PolicyState) -> torch.Tensor:
        """The newest held entry (the last prompt token) is always kept."""
        return protect_ends(state.positions.shape[-1], 0, WINDOW, 1, WINDOW, state.positions.device)

    def score(self, state: PolicyState) -> torch.Tensor:
        if state.window_rows is None:
            raise ValueError("TOVA needs the last prompt query's attention row (run with a Recorder).")
        n = state.positions.shape[-1]
        scores = tova_scores(state.window_rows[..., -1, :n].float(), state.kv_heads)
        return F.pad(scores, (0, 1), value=float("nan"))
