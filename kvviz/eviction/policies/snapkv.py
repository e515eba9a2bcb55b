"""SnapKV (Li et al. 2024): once, after the prefill, the last prompt queries vote for what to keep.

The last ``window_size`` prompt queries' attention rows (softmax over every prompt key, the window's
own keys included, causal) are averaged over the window, smoothed along the sequence by 1-D pooling
(``kernel_size``, zero padding of kernel_size // 2 counted in the average for ``avg``), averaged
over the query heads of each KV group, and the top ``n_kept − window_size`` prefix positions are
kept together with the whole window. Nothing is compressed while decoding. These are the
semantics of kvpress's ``SnapKVPress`` (0.5.x), including its tie-breaking (a top-k over the
prefix scores padded with a value above every score for the window); ``pooling="max"`` is the
original repository's max-pool variant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kvviz.eviction.policies.base import KEPT, WINDOW, Policy, PolicyState, Selection, group_mean


def snapkv_scores(
    window_rows: torch.Tensor, window_size: int, kernel_size: int, pooling: str, kv_heads: int
) -> torch.Tensor:
    """Pooled votes for the prefix: [..., Hq, W, L] attention rows → [..., Hkv, L − window_size].

    ``window_rows`` holds the rows of (at least) the last ``window_size`` prompt queries over all L
    prompt keys; only the last ``window_size`` rows vote, and only for the first L − window_size keys.
    """
    n = window_rows.shape[-1]
    if window_rows.shape[-2] < window_size or n <= window_size:
        raise ValueError(
            f"SnapKV needs the last {window_size} prompt queries' rows and a prompt longer than the "
            f"window ({n} tokens given)."
        )
    votes = window_rows[..., -window_size:, : n - window_size].float().mean(-2)  # [..., Hq, L-w]
    flat = votes.reshape(-1, 1, n - window_size)  # [N, 1, L-w]: pool each head's sequence on its own
    pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
    pooled = pool(flat, kernel_size=kernel_size, stride=1, padding=kernel_size // 2).reshape(votes.shape)
    return group_mean(pooled, kv_heads)


def snapkv_keep(scores: torch.Tensor, n_kept: int, window_size: int) -> torch.Tensor:
    """Kept positions [..., Hkv, n_kept] (ascending) from prefix scores [..., Hkv, L − window_size].

    The window is padded with a score above every prefix score, so it is always kept and the rest of
    the budget goes to the best prefix positions (top-k, as kvpress does it).
    """
    padded = F.pad(scores, (0, window_size), value=float(scores.max()) + 1.0)
    return torch.topk(padded, n_kept, dim=-1).indices.sort(dim=-1).values


@dataclass
class SnapKV(Policy):
    """Observation-window voting after the prefill; decodes with the compressed cache plus new tokens."""

    window_size: int = field(
        default=64, metadata={"help": "last prompt tokens whose queries vote (always kept)", "min": 1, "max": 128}
    )
    kernel_size: int = field(
        default=5, metadata={"help": "1-D pooling width over positions (odd)", "min": 1, "max": 31}
    )
    pooling: str = field(default="avg", metadata={"help": "how votes are smoothed", "choices": ["avg", "max"]})

    name = "snapkv"
    title = "SnapKV (observation-window votes)"
    paper = "Li et al. 2024, SnapKV: LLM Knows What You are Looking for Before Generation"
    summary = (
        "After the prefill, the last prompt tokens (usually the question) vote with their attention for "
        "the earlier positions each KV head keeps; the cache then grows normally while decoding."
    )
    score_label = "pooled vote (mean attention from the observation window, pooled, group mean)"
    needs_window_rows = True

    def validate(self, n_kept: int, n_prompt: int) -> None:
        for name in ("window_size", "kernel_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise ValueError(f"{name} must be a whole number ≥ 1, got {v!r}.")
        if self.kernel_size % 2 == 0:
            raise ValueError(
                f"kernel_size must be odd (the pooled votes must line up with positions), got {self.kernel_size}."
            )
        if self.pooling not in ("avg", "max"):
            raise ValueError(f"pooling must be 'avg' or 'max', got {self.pooling!r}.")
        if n_kept < n_prompt and n_kept < self.window_size:
            raise ValueError(
                f"SnapKV always keeps its observation window of {self.window_size} tokens: the budget "
                f"({n_kept} tokens) must be at least window_size, or lower window_size."
            )

    @property
    def observation_window(self) -> int:
        return int(self.window_size)

    def select(self, state: PolicyState) -> Selection:
        if state.window_rows is None:
            raise ValueError("SnapKV needs the observation-window attention rows (run with a Recorder).")
        n = state.positions.shape[-1]
        w = int(self.window_size)
        prefix = snapkv_scores(state.window_rows[..., :n], w, self.kernel_size, self.pooling, state.kv_heads)
        keep = snapkv_keep(prefix, state.n_kept, w)  # slots == positions right after the prefill
        keep = state.positions.gather(-1, keep)
        roles = torch.where(keep >= state.positions[..., n - w : n - w + 1], WINDOW, KEPT)
        scores = F.pad(prefix, (0, w), value=float("nan"))
        return Selection(keep=keep, roles=roles, scores=scores)
