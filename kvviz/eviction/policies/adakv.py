"""AdaKV (Feng et al. 2024) around SnapKV: per-head budgets from one selection over all heads of a layer.

SnapKV scores every entry of every KV head (the window padded above every score). AdaKV then keeps
the layer's ``Hkv × n_kept`` best entries *across* heads, so a head whose votes are concentrated
gives budget to one whose votes are spread; a safeguard first guarantees each head its own top
``max(1, int(alpha_safeguard × n_kept))`` entries. The layer keeps as many entries as uniform
SnapKV; each head a different number. kvpress's ``AdaKVPress`` (0.5.5) keeps every entry and masks
the evicted ones in attention (so it frees no memory); kvviz's evicting cache stores each layer
padded to its fullest head and masks the padding, and reports the bytes a store holding ragged heads
(AdaKV's own flattened cache) would take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvviz.eviction.policies.base import EVICTED, PolicyState, Selection, pad_ragged
from kvviz.eviction.policies.scorer import COMPETES
from kvviz.eviction.policies.snapkv import SnapKV


def adakv_keep_mask(scores: torch.Tensor, n_kept: int, alpha_safeguard: float) -> torch.Tensor:
    """One layer's scores [Hkv, n] (window already padded above every score) → kept mask [Hkv, n] with Hkv × n_kept True.

    kvpress's order of operations: safeguard each head's top entries with the largest float, then
    evict the ``Hkv × (n − n_kept)`` lowest scores over the whole layer.
    """
    hkv, n = scores.shape
    scores = scores.clone()
    n_safe = int(n_kept * alpha_safeguard)
    if alpha_safeguard > 0:
        n_safe = max(1, n_safe) if n_kept > 0 else 0
    top = torch.topk(scores, n_safe, dim=-1).indices
    scores.scatter_(-1, top, torch.finfo(scores.dtype).max)
    n_pruned = hkv * (n - n_kept)
    pruned = torch.topk(-scores.reshape(-1), n_pruned).indices
    keep = torch.ones(hkv * n, dtype=torch.bool, device=scores.device)
    keep[pruned] = False
    return keep.view(hkv, n)


@dataclass
class AdaKV(SnapKV):
    """SnapKV's votes, with the layer's budget shared out among its KV heads."""

    alpha_safeguard: float = field(
        default=0.2,
        metadata={
            "help": "share of the per-head budget each head keeps whatever the others score",
            "min": 0.0,
            "max": 1.0,
        },
    )

    name = "adakv"
    title = "AdaKV around SnapKV (per-head budgets)"
    paper = "Feng et al. 2024, Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation"
    summary = (
        "SnapKV's votes, but each layer's budget is shared among its KV heads by one selection over all of "
        "them (each head keeps at least a safeguard share): heads with concentrated attention give entries "
        "to heads that need more."
    )
    ragged = True

    def validate(self, n_kept: int, n_prompt: int) -> None:
        super().validate(n_kept, n_prompt)
        a = self.alpha_safeguard
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
            raise ValueError(f"alpha_safeguard must be between 0 and 1, got {a!r}.")

    def select(self, state: PolicyState) -> Selection:
        scores = self.score(state)  # [Lyr, Hkv, n], NaN on the window
        n = state.positions.shape[-1]
        if n <= state.n_kept:
            return super().select(state)
        protect = self.protect(state).expand(scores.shape)
        free = protect == COMPETES
        per_layer, roles = [], []
        for layer in range(scores.shape[0]):
            s = scores[layer]
            top = float(s[free[layer]].max())  # kvpress pads the window with the layer's best score + 1
            padded = torch.where(free[layer], s, top + 1.0)
            keep = adakv_keep_mask(padded, state.n_kept, float(self.alpha_safeguard))
            per_layer.append([state.positions[layer, h][keep[h]] for h in range(keep.shape[0])])
            role = torch.where(free[layer], self.picked_role, protect[layer])
            roles.append([role[h][keep[h]] for h in range(keep.shape[0])])
        keep = pad_ragged(per_layer, state.positions.device)
        return Selection(keep=keep, roles=pad_ragged(roles, state.positions.device).clamp(min=EVICTED), scores=scores)
