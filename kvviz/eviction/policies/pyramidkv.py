"""PyramidKV (Cai et al. 2024): budgets that shrink with depth, SnapKV's votes inside each layer.

Lower layers attend broadly, upper layers concentrate on a few tokens, so the budget is a pyramid:
layer ℓ keeps ``round(max_num − ℓ·(max_num − min_num)/(layers − 1))`` entries per KV head, with the
same total as a uniform budget of L·(1 − r) (kvpress's ``PyramidKVPress.get_layer_budget``, after
KVCache-Factory): ``max_capacity = window + L(1 − r)``, ``min_num = (max_capacity − window)/beta``,
``max_num = 2(max_capacity − window) − min_num`` (when that exceeds L − window it is capped there
and ``min_num`` raised to keep the total). When the smallest layer would keep less than the
observation window, kvpress falls back to the uniform ``round(L(1 − r))`` (e.g. 350 tokens at
r = 0.75). Inside a layer, SnapKV chooses (window votes, pooled, group mean).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvviz.eviction.policies.base import PolicyState, Selection, pad_ragged
from kvviz.eviction.policies.scorer import select_kept
from kvviz.eviction.policies.snapkv import SnapKV


def layer_budgets(n_tokens: int, ratio: float, window_size: int, beta: int, layers: int) -> list[int]:
    """Entries each layer keeps per KV head: kvpress's pyramid, or its uniform fallback."""
    max_capacity = window_size + n_tokens * (1 - ratio)
    min_num = (max_capacity - window_size) / beta
    max_num = (max_capacity - window_size) * 2 - min_num
    if max_num >= n_tokens - window_size:
        max_num = n_tokens - window_size
        min_num = (max_capacity - window_size) * 2 - max_num
    if not (n_tokens >= max_num >= min_num >= window_size):
        return [max(1, round(n_tokens * (1 - ratio)))] * layers
    steps = (max_num - min_num) / (layers - 1) if layers > 1 else 0.0
    return [round(max_num - layer * steps) for layer in range(layers)]


@dataclass
class PyramidKV(SnapKV):
    """SnapKV inside each layer, with budgets that shrink from the first layer to the last."""

    beta: int = field(
        default=20,
        metadata={
            "help": "pyramid steepness: the last layer keeps 1/beta of the mean "
            "budget beyond the window (larger = steeper)",
            "min": 1,
            "max": 100,
        },
    )

    name = "pyramidkv"
    title = "PyramidKV (budgets shrink with depth)"
    paper = "Cai et al. 2024, PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling"
    summary = (
        "SnapKV's observation-window votes inside each layer, but early layers keep more entries and late "
        "layers fewer (the same total); where the last layer would keep less than the window, one budget for all."
    )
    ragged = True

    def validate(self, n_kept: int, n_prompt: int) -> None:
        super().validate(n_kept, n_prompt)
        if isinstance(self.beta, bool) or int(self.beta) != self.beta or self.beta < 1:
            raise ValueError(f"beta must be a whole number ≥ 1, got {self.beta!r}.")

    def budgets(self, n_tokens: int, n_kept: int, layers: int, ratio: float | None = None) -> list[int]:
        """Per-layer budgets for the requested ratio (or, for a budget in tokens, the ratio n_kept stands for)."""
        r = 1 - n_kept / n_tokens if ratio is None else float(ratio)
        return layer_budgets(n_tokens, r, int(self.window_size), int(self.beta), layers)

    def select(self, state: PolicyState) -> Selection:
        scores = self.score(state)  # [Lyr, Hkv, n], NaN on the window
        protect = self.protect(state)
        n, layers = state.positions.shape[-1], state.positions.shape[0]
        per_layer = []
        for layer, budget in enumerate(self.budgets(n, state.n_kept, layers, state.ratio)):
            if budget < self.window_size and budget < n:
                raise ValueError(
                    f"Layer {layer} would keep {budget} entries, fewer than the {self.window_size}-token "
                    "observation window: raise the budget or lower window_size."
                )
            keep, roles = select_kept(state.positions[layer], min(budget, n), protect, scores[layer], self.picked_role)
            per_layer.append((keep, roles))
        keep = pad_ragged([list(k) for k, _ in per_layer], state.positions.device)
        roles = pad_ragged([list(r) for _, r in per_layer], state.positions.device).clamp(min=0)
        return Selection(keep=keep, roles=roles, scores=scores)
