"""StreamingLLM (Xiao et al. 2023): the first ``sinks`` tokens plus the most recent ones, everywhere.

The same positions are kept in every layer and KV head; the cache is cut back to the budget after
the prefill and after every generated token. After the prefill the kept set is
``[0, sinks) ∪ [L − (n_kept − sinks), L)`` — the set kvpress's ``StreamingLLMPress`` keeps for the
same ratio. With ``reposition`` the keys are re-rotated so a kept entry's RoPE position is its cache
slot, as in the paper (only in kvviz's own generation loop, which feeds slot positions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvviz.eviction.policies.base import SINK, WINDOW, Policy, PolicyState, Selection


def streaming_keep(positions: torch.Tensor, n_kept: int, sinks: int) -> torch.Tensor:
    """Keep the first ``sinks`` held positions and the last ``n_kept − sinks``: [..., n] → [..., n_kept].

    ``positions`` ascending (e.g. ``torch.arange(L)`` right after a prefill of L tokens).
    """
    n = positions.shape[-1]
    if n <= n_kept:
        return positions
    if not 0 <= sinks < n_kept:
        raise ValueError(
            f"StreamingLLM keeps {sinks} sink tokens plus a recent window: the budget "
            f"({n_kept} tokens) must be at least sinks + 1 = {sinks + 1}."
        )
    return torch.cat([positions[..., :sinks], positions[..., n - (n_kept - sinks) :]], dim=-1)


@dataclass
class StreamingLLM(Policy):
    """Attention sinks + a sliding window of recent tokens."""

    sinks: int = field(default=4, metadata={"help": "first tokens always kept (attention sinks)", "min": 0, "max": 64})
    reposition: bool = field(
        default=False,
        metadata={"help": "re-rotate kept keys to their cache slots (the paper's positions); off = original positions"},
    )

    name = "streaming_llm"
    title = "StreamingLLM (sinks + recent)"
    paper = "Xiao et al. 2023, Efficient Streaming Language Models with Attention Sinks"
    summary = (
        "Keeps the first few tokens (attention sinks) and the most recent ones, in every layer and head; "
        "evicts the oldest non-sink token after every generated token."
    )
    evicts_while_decoding = True

    def validate(self, n_kept: int, n_prompt: int) -> None:
        if isinstance(self.sinks, bool) or int(self.sinks) != self.sinks or self.sinks < 0:
            raise ValueError(f"sinks must be a whole number ≥ 0, got {self.sinks!r}.")
        if n_kept <= self.sinks:
            raise ValueError(
                f"StreamingLLM keeps {self.sinks} sink tokens plus a recent window: the budget "
                f"({n_kept} tokens) must be at least sinks + 1 = {self.sinks + 1}."
            )

    @property
    def position_mode(self) -> str:
        return "re-positioned (cache slot = RoPE position)" if self.reposition else "original"

    def select(self, state: PolicyState) -> Selection:
        keep = streaming_keep(state.positions, state.n_kept, self.sinks)
        roles = torch.full_like(keep, WINDOW)
        roles[..., : min(self.sinks, keep.shape[-1])] = SINK
        return Selection(keep=keep, roles=roles)
