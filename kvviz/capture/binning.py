"""Display bins: sums over runs of ``f`` absolute positions, the reduction behind the binned attention
map and the binned decode rows (:mod:`kvviz.capture.recorder`)."""

from __future__ import annotations

import torch


def bin_positions(x: torch.Tensor, start: int, f: int, dim: int) -> tuple[int, torch.Tensor]:
    """Sum ``x`` over bins of ``f`` absolute positions along ``dim`` (x's index 0 = position ``start``).

    Returns (first bin, binned tensor). f == 1 returns x itself (no copy).
    """
    if f == 1:
        return start, x
    n = x.shape[dim]
    head = min((-start) % f, n)  # positions before the first bin boundary
    mid = (n - head) // f * f
    parts = []
    if head:
        parts.append(x.narrow(dim, 0, head).sum(dim, keepdim=True))
    if mid:
        parts.append(x.narrow(dim, head, mid).unflatten(dim, (mid // f, f)).sum(dim + 1))
    if n - head - mid:
        parts.append(x.narrow(dim, head + mid, n - head - mid).sum(dim, keepdim=True))
    return start // f, parts[0] if len(parts) == 1 else torch.cat(parts, dim)
