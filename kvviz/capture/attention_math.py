"""Exact attention probabilities the way transformers' implementations compute them, and the check
that recorded probabilities really produced a layer's output.

The recorder scores queries against keys itself (in chunks, without keeping T × T). What an
implementation adds to plain ``softmax(QKᵀ·scale + mask)`` lives in :class:`Extras`: learned
per-head sink logits (gpt-oss's ``s_aux``, a column every row softmaxes over and that takes part of
the mass), an additive bias (``position_bias``, ALiBi-style) and a sliding window given as a number
rather than in the mask (flash kernels). :func:`check_output` compares probabilities × values with
the implementation's own output, so a variant kvviz does not model fails loudly, never silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvviz.capture.tolerance import output_tolerance
from kvviz.models import CaptureError


@dataclass(frozen=True)
class Extras:
    """What one attention call adds to the plain formula (None when it does not)."""

    sinks: torch.Tensor | None = None  # [Hq] learned sink logits
    bias: torch.Tensor | None = None  # [B, 1 or Hq, q, k] additive
    window: int | None = None  # sliding window, applied only where no mask carries it

    def __bool__(self) -> bool:
        return self.sinks is not None or self.bias is not None or self.window is not None


def softmax_(s: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor | None:
    """Softmax over the last axis of scores ``s`` [Hq, n, k], in place. With learned ``sinks`` each row
    also softmaxes over its head's sink logit; returns the mass that went to the sink, [Hq, n]."""
    if sinks is None:
        torch.softmax(s, dim=-1, out=s)
        return None
    logit = sinks.float().view(-1, 1)  # [Hq, 1]
    total = torch.logaddexp(torch.logsumexp(s, dim=-1), logit)  # [Hq, n]: log of the row's whole denominator
    s.sub_(total.unsqueeze(-1)).exp_()
    return torch.exp(logit - total)


def mask_window_(s: torch.Tensor, q0: int, k0: int, window: int) -> None:
    """Mask keys more than ``window - 1`` positions before their query, in place (s: [Hq, n, k];
    query 0 is absolute position ``q0``, key 0 is ``k0``)."""
    qp = torch.arange(q0, q0 + s.shape[1], device=s.device)[:, None]
    kp = torch.arange(k0, k0 + s.shape[2], device=s.device)[None, :]
    s.masked_fill_(kp <= qp - window, float("-inf"))


def is_causal(mask: torch.Tensor, k_len: int) -> bool:
    """Whether a bool mask [B, 1 or Hq, q, k] over ``k_len`` keys lets its query r see exactly keys
    0 … k_len - q + r (plain causal: a prompt chunk over the cache before it; no window, no padding)."""
    q_len = mask.shape[-2]
    if mask.shape[-1] != k_len:
        return False
    rows = torch.arange(k_len - q_len, k_len, device=mask.device)[:, None]  # [q, 1]: each query's position
    return bool((mask[0] == (torch.arange(k_len, device=mask.device) <= rows)).all())


def decode_probs(
    query, key, mask, scaling, softcap, extras: Extras | None, qpos: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact attention row of one query per head, [Hq, k] fp32 (keys not repeated), and the learned
    sink's share [Hq] (None without sinks). ``qpos``: the query's absolute position."""
    hq, d = query.shape[1], query.shape[-1]
    hkv, k_len = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    q = (query[0, :, 0].float() * scale).view(hkv, hq // hkv, d)  # [Hkv, g, D]
    s = torch.bmm(q, key[0].float().transpose(1, 2)).view(hq, 1, k_len)  # [Hq, 1, k]
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if extras is not None and extras.bias is not None:
        s = s + extras.bias[0, :, -1:, :k_len].float()
    if mask is not None:
        m = mask[0, :, -1:, :k_len]  # [1 or Hq, 1, k]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
    elif extras is not None and extras.window is not None:
        mask_window_(s, qpos, qpos + 1 - k_len, extras.window)
    learned = softmax_(s, extras.sinks if extras is not None else None)
    return s[:, 0], None if learned is None else learned[:, 0]


def check_output(layer: int, probs: torch.Tensor, value, out) -> None:
    """Raise :class:`CaptureError` unless ``probs`` × values reproduce the implementation's output.

    probs: [Hq, n, k] for the last n queries of the call, over the first k cached values;
    value: [B, Hkv, ≥k, Dv]; out: [B, q, Hq, Dv] as transformers' implementations return it.
    """
    if value is None or out is None:
        return
    hq, n, k = probs.shape
    hkv, dv = value.shape[1], value.shape[-1]
    if out.dim() != 4 or tuple(out.shape[2:]) != (hq, dv):
        raise CaptureError(
            f"Layer {layer}'s attention output has shape {tuple(out.shape)}, not [batch, queries, "
            f"{hq} heads, {dv}]: kvviz cannot check what it recorded against it."
        )
    mine = torch.bmm(probs.reshape(hkv, (hq // hkv) * n, k), value[0, :, :k].float()).view(hq, n, dv)
    agree(layer, mine, out[0, -n:].transpose(0, 1), out.dtype, "the probabilities it recorded do not reproduce")


def agree(layer: int, mine: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Raise :class:`CaptureError` unless kvviz's attention output ``mine`` matches the implementation's
    ``ref`` (same shape) within the tolerance of ``dtype``; ``what`` says what kvviz computed."""
    ref = ref.float()
    err, size = (mine.float() - ref).abs().max().item(), ref.abs().max().item()
    tol = output_tolerance(dtype) * max(size, 1e-3)
    if not err <= tol:
        raise CaptureError(
            f"kvviz cannot capture layer {layer} faithfully: {what} the layer's own attention output "
            f"(max error {err:.2g} on outputs up to {size:.2g}); the model's attention uses a feature "
            "kvviz does not model."
        )
