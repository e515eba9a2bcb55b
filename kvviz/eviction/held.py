"""What an eviction run reads back from its cache: the kept keys and values in position order, and the role
(sink, window, heavy hitter, kept, evicted) of every position per layer and KV head, for the views."""

from __future__ import annotations

import torch

from kvviz.eviction.cache import EvictingCache
from kvviz.eviction.policies import EVICTED, KEPT, Selection


def held_kv(cache: EvictingCache, order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache's keys and values [Lyr, Hkv, n, D] in ascending position order (``order`` [Lyr, Hkv, n])."""
    stored = [layer.stored() for layer in cache.evicting_layers]
    keys = torch.stack([k[0] for k, _ in stored])  # [Lyr, Hkv, n, D]
    values = torch.stack([v[0] for _, v in stored])
    idx = order.to(keys.device)[..., None]
    return keys.gather(2, idx.expand(*order.shape, keys.shape[-1])), values.gather(
        2, idx.expand(*order.shape, values.shape[-1])
    )


def role_map(sel: Selection, n_prompt: int) -> torch.Tensor:
    """Role of every prompt position per layer and KV head [Lyr, Hkv, n_prompt] (EVICTED where not kept).

    A ragged selection pads short heads with -1: those entries land in a spare column that is cut off, so
    padding never writes a role onto a real position (position 0 would otherwise read "evicted")."""
    keep = sel.keep.cpu()
    out = torch.full((*keep.shape[:2], n_prompt + 1), EVICTED, dtype=torch.int8)  # last column: padding
    valid = (keep >= 0) & (keep < n_prompt)
    out.scatter_(-1, torch.where(valid, keep, n_prompt), sel.roles.cpu().to(torch.int8))
    return out[..., :n_prompt]


def ragged_roles(positions: torch.Tensor, roles: torch.Tensor, n_prompt: int) -> torch.Tensor:
    """Role codes aligned with a ragged cache's ``positions()``: prompt entries from the decision, later ones KEPT."""
    pos = positions.cpu()
    from_map = roles.gather(-1, pos.clamp(0, n_prompt - 1))
    return torch.where(pos < 0, EVICTED, torch.where(pos < n_prompt, from_map, KEPT)).to(torch.int8)
