"""ExpectedAttention (Devoto et al. 2025): the attention future queries are expected to pay, times the value norm.

Queries are modelled as Gaussian: the mean μ and covariance Σ of the prompt's queries before RoPE
(the first ``n_sink`` tokens left out: they hold outliers). The next ``n_future_positions`` queries
will be rotated by RoPE at positions L, L+1, …; averaging those rotations gives one matrix R̄, so
a future query is ≈ N(R̄μ, R̄ΣR̄ᵀ). For a key k, E[exp(q·k/√d)] = exp(k·R̄μ/√d + kᵀR̄ΣR̄ᵀk / 2d): a
softmax of that over the held keys is the expected attention, averaged over the query heads of each
KV group and multiplied by ‖v‖₂ (an entry with a small value contributes little even if attended).
The first ``n_sink`` entries are always kept. These are kvpress's ``ExpectedAttentionPress``
defaults and order of operations (0.5.5): 512 future positions, 4 sinks, covariance and value norm on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from kvviz.eviction.policies.base import SINK, PolicyState
from kvviz.eviction.policies.scorer import ScorerPolicy, protect_ends


def average_rope(rotary, like: torch.Tensor, start: int, n_future: int, head_dim: int) -> torch.Tensor:
    """R̄ [D, D]: the mean of RoPE's rotation matrices at positions start … start + n_future − 1."""
    position_ids = torch.arange(start, start + n_future).unsqueeze(0).to(like.device)
    cos, sin = rotary(like, position_ids)
    cos, sin = cos[0], sin[0]  # [P, D]
    eye = torch.eye(head_dim, device=cos.device, dtype=cos.dtype)
    swap = torch.zeros((head_dim, head_dim), device=cos.device, dtype=cos.dtype)
    half = head_dim // 2
    swap[half:, :half], swap[:half, half:] = torch.eye(half), -torch.eye(half)
    return (cos.unsqueeze(1) * eye + sin.unsqueeze(1) * swap).mean(dim=0).to(like.device)  # [D, D]


def expected_attention_scores(
    keys: torch.Tensor,
    values: torch.Tensor,
    mean: torch.Tensor,
    cov: torch.Tensor | None,
    rot: torch.Tensor,
    use_vnorm: bool,
    epsilon: float,
) -> torch.Tensor:
    """One layer: keys/values [Hkv, n, D] (sinks removed), query mean [Hq, D] and covariance [Hq, D, D]
    before RoPE, R̄ [D, D] → scores [Hkv, n]."""
    hkv, n, d = keys.shape
    group = mean.shape[0] // hkv
    mu = torch.matmul(mean[None], rot.T)  # [1, Hq, D]
    k = keys[None].repeat_interleave(group, dim=1).transpose(2, 3)  # [1, Hq, D, n]: repeat_kv order
    scores = torch.matmul(mu.unsqueeze(2), k).squeeze(2) / math.sqrt(d)  # [1, Hq, n]
    if cov is not None:
        sigma = torch.matmul(rot, torch.matmul(cov[None], rot.T))  # [1, Hq, D, D]
        scores += torch.einsum("bhin, bhij, bhjn->bhn", k, sigma, k) / d / 2
    scores = F.softmax(scores, dim=-1)
    scores = scores.view(1, hkv, group, n).mean(dim=2)[0]  # [Hkv, n]
    if use_vnorm:
        scores = (scores + epsilon) * values.norm(dim=-1)
    return scores


@dataclass
class ExpectedAttention(ScorerPolicy):
    """Expected future attention × value norm, per layer and KV head; decided once after the prefill."""

    n_future_positions: int = field(
        default=512,
        metadata={"help": "future query positions whose RoPE rotations are averaged", "min": 1, "max": 8192},
    )
    n_sink: int = field(
        default=4,
        metadata={"help": "first tokens always kept and left out of the query statistics", "min": 0, "max": 64},
    )
    use_covariance: bool = field(
        default=True, metadata={"help": "add the queries' covariance term (else the mean only)"}
    )
    use_vnorm: bool = field(default=True, metadata={"help": "multiply by the value's L2 norm"})

    name = "expected_attention"
    title = "ExpectedAttention (future queries, RoPE, value norm)"
    paper = "Devoto et al. 2025, Expected Attention: KV Cache Compression by Estimating Attention from Future Queries"
    summary = (
        "Models the next queries from the statistics of the prompt's queries rotated to the next positions, "
        "scores each key by the attention they are expected to pay it times its value's norm; no attention "
        "map is needed, so it works the same with or without the question in the prompt."
    )
    score_label = "expected attention of the next queries × ‖value‖₂ (group mean)"
    needs_kv = True
    epsilon: ClassVar[float] = 0.0  # added to the expected attention before the value-norm product (kvpress's default)

    def validate(self, n_kept: int, n_prompt: int) -> None:
        for name in ("n_future_positions", "n_sink"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < (1 if name == "n_future_positions" else 0):
                raise ValueError(
                    f"{name} must be a whole number ≥ {1 if name == 'n_future_positions' else 0}, got {v!r}."
                )
        if n_prompt <= self.n_sink + 1:
            raise ValueError(f"ExpectedAttention needs a prompt longer than n_sink + 1 = {self.n_sink + 1} tokens.")
        if n_kept < n_prompt and n_kept < self.n_sink:
            raise ValueError(
                f"ExpectedAttention always keeps its {self.n_sink} sink tokens: the budget ({n_kept}) "
                "must be at least n_sink."
            )

    @property
    def query_stats_skip(self) -> int | None:
        return int(self.n_sink)

    def protect(self, state: PolicyState) -> torch.Tensor:
        return protect_ends(state.positions.shape[-1], int(self.n_sink), SINK, 0, SINK, state.positions.device)

    def score(self, state: PolicyState) -> torch.Tensor:
        stats = state.query_stats
        if state.keys is None or state.values is None or stats is None:
            raise ValueError("ExpectedAttention needs the held keys and values and the prefill's query statistics.")
        if stats.skip != self.n_sink:
            raise ValueError(f"The query statistics leave out {stats.skip} tokens, not n_sink = {self.n_sink}.")
        s, d = int(self.n_sink), state.keys.shape[-1]
        rot = average_rope(stats.rotary, stats.mean[0], stats.n, int(self.n_future_positions), d)
        out = []
        for layer in range(state.keys.shape[0]):
            cov = stats.cov[layer] if self.use_covariance else None
            out.append(
                expected_attention_scores(
                    state.keys[layer, :, s:],
                    state.values[layer, :, s:],
                    stats.mean[layer],
                    cov,
                    rot,
                    self.use_vnorm,
                    self.epsilon,
                )
            )
        return F.pad(torch.stack(out), (s, 0), value=float("nan"))
