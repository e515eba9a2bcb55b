"""RoPE positions of decoded tokens off by one: the new token's query and key rotated for position p + 1
(a cache position counted from 1, or from the cache length after the append)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.capture.faults.base import Fault


def rotate(x: torch.Tensor, inv_freq: torch.Tensor, delta: int) -> torch.Tensor:
    """``x`` [B, H, q, D] rotated ``delta`` positions further (RoPE rotations compose: R(p + δ) = R(δ)·R(p))."""
    freqs = (delta * inv_freq.float()).to(x.device)
    cos, sin = torch.cat([freqs, freqs]).cos().to(x.dtype), torch.cat([freqs, freqs]).sin().to(x.dtype)
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # rotate_half, the Llama layout
    return x * cos + turned * sin


@dataclass(frozen=True)
class RopeOffByOne(Fault):
    name = "rope_off_by_one"
    title = "RoPE position off by one"
    source = (
        "the cache-position vs sequence-position confusion reported across engines' decode paths "
        "(a position read from the cache length after the append instead of before)"
    )
    lesson = (
        "A decoded token rotated for position p + 1 shifts every relative distance by one; the fix is to rotate "
        "the new token at its own index in the sequence (the cache length before the append)."
    )
    shows = "the struck layer's new key leaves its tolerance at the struck step, then its attention output"
    first = "K"

    def _inv_freq(self) -> torch.Tensor:
        found = getattr(self, "_freq", None)
        if found is None:
            raise RuntimeError("The RoPE fault starts with its run (Generation(cache=CacheSetup(fault=...))).")
        return found

    def begin(self, g) -> None:
        rotary = getattr(g.lm.model.base_model, "rotary_emb", None)
        inv = getattr(rotary, "inv_freq", None)
        if not isinstance(inv, torch.Tensor):
            raise ValueError(f"{g.lm.name} has no rotary embedding kvviz can shift (rotary_emb.inv_freq).")
        object.__setattr__(self, "_freq", inv)

    def store(self, keys, values, layer):
        return rotate(keys, self._inv_freq(), 1), values

    def attend(self, module, query, key, value, scaling, window=None):
        from kvviz.capture.faults.base import sdpa

        return sdpa(rotate(query, self._inv_freq(), 1), key, value, scaling)
