"""KNorm (Devoto et al. 2024): keep the keys with the smallest L2 norm; no attention is needed.

The paper observed that a key's L2 norm and the attention it receives are strongly anti-correlated:
small-norm keys (the sinks among them) draw the most attention. So the score of a held entry is
``−‖k‖₂`` of its key as stored (RoPE applied), per layer and KV head, in fp32, and the top
``n_kept`` are kept; nothing is protected. These are kvpress's ``KnormPress`` semantics (0.5.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.eviction.policies.base import PolicyState
from kvviz.eviction.policies.scorer import COMPETES, ScorerPolicy


def knorm_scores(keys: torch.Tensor) -> torch.Tensor:
    """[..., n, D] keys → [..., n] scores −‖k‖₂, accumulated in at least fp32 (as kvpress does)."""
    return -torch.linalg.vector_norm(keys, dim=-1, dtype=torch.promote_types(keys.dtype, torch.float32))


@dataclass
class KNorm(ScorerPolicy):
    """Smallest key norms win, per layer and KV head; decided once after the prefill."""

    name = "knorm"
    title = "KNorm (smallest key norms)"
    paper = "Devoto et al. 2024, A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression"
    summary = (
        "Keeps, per layer and KV head, the keys with the smallest L2 norm: low-norm keys tend to receive "
        "the most attention, so no attention has to be computed to choose."
    )
    score_label = "−‖key‖₂ (negative L2 norm of the stored key; higher = kept first)"
    needs_kv = True

    def protect(self, state: PolicyState) -> torch.Tensor:
        return torch.full((state.positions.shape[-1],), COMPETES, dtype=torch.long)

    def score(self, state: PolicyState) -> torch.Tensor:
        if state.keys is None:
            raise ValueError("KNorm needs the held keys.")
        return knorm_scores(state.keys)
