"""H2O, the heavy-hitter oracle (Zhang et al. 2023): keep recent tokens plus the most-attended older ones.

Per layer and KV head, a held entry's score is the attention it has received, summed over every
query so far (prompt queries, then one per generated token; not normalised), averaged over the
query heads of the KV group. The cache is cut to the budget after the prefill and after every
generated token: the ``n_recent`` newest entries are never evicted, the others compete on score.
A new token enters with the attention it got from its own query and keeps accumulating while it
sits in the recent window, so it competes on the same rule as the prompt's tokens once it leaves
it. An evicted entry is gone for good (it can no longer receive attention, nor come back).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvviz.eviction.policies.base import HEAVY, WINDOW, Policy, PolicyState, Selection, group_mean


def split_budget(n_kept: int, heavy_fraction: float) -> tuple[int, int]:
    """(n_heavy, n_recent) with n_heavy = int(n_kept × fraction); at least one recent entry (the newest token)."""
    n_heavy = min(int(n_kept * heavy_fraction), n_kept - 1)
    return n_heavy, n_kept - n_heavy


def h2o_keep(scores: torch.Tensor, positions: torch.Tensor, n_kept: int, n_recent: int) -> torch.Tensor:
    """Keep the ``n_recent`` newest held entries and the top-scoring others: [..., n] → [..., n_kept].

    ``scores`` and ``positions`` are aligned, positions ascending per head.
    """
    n = positions.shape[-1]
    if n <= n_kept:
        return positions
    n_heavy = n_kept - n_recent
    older = n - n_recent
    top = torch.topk(scores[..., :older], n_heavy, dim=-1).indices.sort(dim=-1).values
    return torch.cat([positions.gather(-1, top), positions[..., older:]], dim=-1)


def accumulated_scores(colsum: torch.Tensor, positions: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Accumulated attention of each held entry: colsum [Lyr, Hq, T] at positions [Lyr, Hkv, n] → [Lyr, Hkv, n]."""
    per_query_head = positions.repeat_interleave(colsum.shape[-2] // kv_heads, dim=-2)  # [Lyr, Hq, n]
    return group_mean(colsum.gather(-1, per_query_head.to(colsum.device)), kv_heads)


@dataclass
class H2O(Policy):
    """Heavy hitters + recent window; evicts after the prefill and after every generated token."""

    heavy_fraction: float = field(
        default=0.5,
        metadata={
            "help": "share of the budget for heavy hitters (the rest is the recent window); 0.5 = 1:1",
            "min": 0.0,
            "max": 0.95,
        },
    )

    name = "h2o"
    title = "H2O (heavy hitters + recent)"
    paper = "Zhang et al. 2023, H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs"
    summary = (
        "Per head, keeps the tokens that have received the most attention so far plus the most recent ones; "
        "re-decides after every generated token."
    )
    score_label = "accumulated attention received (sum of attention weights over all queries so far, group mean)"
    evicts_while_decoding = True
    needs_colsum = True

    def validate(self, n_kept: int, n_prompt: int) -> None:
        hf = self.heavy_fraction
        if isinstance(hf, bool) or not isinstance(hf, (int, float)) or not 0.0 <= hf < 1.0:
            raise ValueError(
                f"heavy_fraction must be in [0, 1) (the rest of the budget is the recent window), got {hf!r}."
            )

    def select(self, state: PolicyState) -> Selection:
        if state.colsum is None:
            raise ValueError("H2O needs the accumulated attention (run with a Recorder).")
        scores = accumulated_scores(state.colsum, state.positions, state.kv_heads)
        n_heavy, n_recent = split_budget(state.n_kept, self.heavy_fraction)
        keep = h2o_keep(scores, state.positions, state.n_kept, n_recent)
        roles = keep.new_full(keep.shape, HEAVY)
        roles[..., keep.shape[-1] - n_recent :] = WINDOW
        return Selection(keep=keep, roles=roles, scores=scores)
