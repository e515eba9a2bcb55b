"""Statistics of the prefill's queries before RoPE, per layer and query head: what ExpectedAttention predicts from.

``collecting(model, skip, ends)`` installs one forward pre-hook per attention layer for the block
(removed in ``finally``); the hooks read the hidden states each layer's attention receives, project
them to queries exactly as kvpress's ``get_prerope_query_states`` does (``q_proj``, then ``q_norm``
where the model has one), and keep for every end point ``e`` in ``ends`` the mean and covariance of
the queries at positions ``[skip, e)`` — one prefill serves both a query-aware state (the whole
prompt) and a query-agnostic one (the context alone). Nothing T × T is kept: [Lyr, Hq, D, D] per end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from kvviz.models import attention_modules


@dataclass
class QueryStats:
    """Pre-RoPE query statistics of prompt positions ``[skip, n)``: mean [Lyr, Hq, D], covariance [Lyr, Hq, D, D].

    ``rotary(x, position_ids) → (cos, sin)`` is the model's rotary embedding ([1, P, D] each), which
    ExpectedAttention averages over the positions it expects future queries at.
    """

    skip: int
    n: int
    mean: torch.Tensor
    cov: torch.Tensor
    rotary: Callable


def rotary_embedding(model) -> Callable:
    """The model's rotary embedding module (the one with ``inv_freq``), called as ``(x, position_ids)``."""
    for module in model.modules():
        if isinstance(getattr(module, "inv_freq", None), torch.Tensor) and "Rotary" in type(module).__name__:
            return module
    raise ValueError("This model has no rotary embedding; ExpectedAttention needs RoPE.")


def prerope_queries(module, hidden: torch.Tensor) -> torch.Tensor:
    """[B, T, hidden] → [B, Hq, T, D], as kvpress's ``get_prerope_query_states`` (Llama-like ``q_proj``)."""
    if not hasattr(module, "q_proj"):
        raise ValueError(f"{type(module).__name__} has no q_proj; kvviz reads pre-RoPE queries from Llama-like layers.")
    bsz, t, _ = hidden.shape
    q = module.q_proj(hidden).view(bsz, t, module.config.num_attention_heads, module.head_dim).transpose(1, 2)
    norm = getattr(module, "q_norm", None)
    return norm(q) if norm is not None else q


def mean_and_cov(queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, Hq, t, D] → mean [B, Hq, D], covariance [B, Hq, D, D] (divided by t), in kvpress's order of operations."""
    mu = queries.mean(dim=2, keepdim=True)
    centered = queries - mu
    cov = torch.einsum("bnsi,bnsj->bnij", centered, centered) / queries.shape[2]
    return mu.squeeze(2), cov


@dataclass
class _Collector:
    skip: int
    ends: list[int]
    seen: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)  # end → layer → stats
    offset: int = 0  # prompt tokens fed by earlier forwards (a prefill in chunks)
    pending: dict[int, torch.Tensor] = field(default_factory=dict)  # layer → hidden states of earlier chunks
    thread: int = field(default_factory=threading.get_ident)  # hooks see every thread's forwards: only this one's count

    def hook(self, module, args, kwargs) -> None:
        if threading.get_ident() != self.thread:
            return
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        layer = module.layer_idx
        if layer in self.pending:  # a later chunk of the same prefill: statistics over everything so far
            hidden = torch.cat([self.pending[layer], hidden], dim=1)
        if any(end > hidden.shape[1] for end in self.ends):  # a later chunk will need these rows too
            self.pending[layer] = hidden
        else:
            self.pending.pop(layer, None)
        for end in self.ends:
            if end <= hidden.shape[1] and layer not in self.seen.get(end, {}):
                q = prerope_queries(module, hidden[:, self.skip : end])
                self.seen.setdefault(end, {})[layer] = mean_and_cov(q)


@contextmanager
def collecting(model, skip: int, ends: list[int]) -> Iterator[Callable[[int], QueryStats]]:
    """Record query statistics during the block's prefill forward(s); yields ``stats(end) → QueryStats``.

    ``ends``: prompt lengths at which statistics are wanted (a context and the context + question
    from one prefill); a prefill fed in chunks is gathered until every end is reached.
    """
    if any(e <= skip for e in ends):
        raise ValueError(f"The prompt must be longer than the {skip} tokens left out of the query statistics.")
    collector = _Collector(skip, sorted(set(ends)))
    modules = attention_modules(model)
    rotary = rotary_embedding(model)
    hooks = [m.register_forward_pre_hook(collector.hook, with_kwargs=True) for m in modules]
    layers = len(modules)

    def stats(end: int) -> QueryStats:
        got = collector.seen.get(end, {})
        if len(got) != layers:
            raise ValueError(f"No query statistics were recorded for a prefill ending at {end} tokens.")
        mean = torch.stack([got[i][0][0] for i in range(layers)])  # [Lyr, Hq, D]
        cov = torch.stack([got[i][1][0] for i in range(layers)])  # [Lyr, Hq, D, D]
        return QueryStats(skip, end, mean, cov, rotary)

    try:
        yield stats
    finally:
        for h in hooks:
            h.remove()
        collector.pending.clear()
