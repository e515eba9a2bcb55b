"""How far two computations of the same model may differ in the dtype it runs in, and what else must agree.

The equivalence check (:mod:`kvviz.capture.verify`) compares the logits of cached decoding with those of a
full recomputation. Both compute the same function in a different order (a decode step's one query against
stored keys, a prefill's whole causal matrix; different matrix shapes, so different summation orders), and
every order rounds differently. How much depends on the dtype: a number ``z`` held in a dtype with machine
epsilon ``eps`` (``torch.finfo(dtype).eps``: 2⁻²³ for fp32, 2⁻¹⁰ for fp16, 2⁻⁷ for bf16) is known only to
``eps·|z|``. In bf16 a logit near 20 sits between representable numbers 0.125 apart, so the two paths can
land half a logit apart while the model is exactly the same; in fp32 they agree to ~1e-5.

The tolerance (:func:`logit_tolerance`) is therefore ``max(EQUIVALENCE_TOLERANCE, √n_layers · eps · max|logit|)``:

- ``eps · max|logit|``: one rounding at the scale of the largest logit compared (the output head's rounding);
- ``√n_layers``: each layer adds its own rounding of relative size ``eps`` to the residual stream, and
  independent errors grow like the square root of their number;
- the floor :data:`~kvviz.capture.trace.EQUIVALENCE_TOLERANCE` (1e-3), which is what fp32 gets: there the
  formula gives ~2e-5, below what kernels with different reduction orders (SDPA against eager attention)
  already differ by.

SmolLM2-135M in bf16 (30 layers, largest |logit| ~35) gets ~1.5: its measured differences are 0.5–0.8.
A bug in the cache (a wrong position, a dropped entry) moves logits by whole units and changes which token
wins, so the check also compares the ranking itself (:func:`agreement`): at every checked position, whether
the greedy token (top-1) and the top-:data:`TOP_K` tokens in order are the same in both computations. Where
the two candidates swapped are closer than the tolerance in the recomputation, their order is a coin toss of
rounding, so such near-ties are counted apart.

The debugger (:mod:`kvviz.capture.divergence`) compares every step × layer's K, V and attention output
too, each against its own scale, with :func:`divergence_tolerance` (√eps): all of kvviz's tolerances are
here, read from one source, the dtype's ``eps``.
"""

from __future__ import annotations

import math

import torch

from kvviz.capture.trace import EQUIVALENCE_TOLERANCE

OUTPUT_ROUNDINGS = 4.0  # an attention output recomputed in another order: a few roundings of relative size eps
TOP_K = 5  # the ranking compared at every checked position


def eps(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype (the spacing of numbers just above 1)."""
    return float(torch.finfo(dtype).eps)


def logit_tolerance(dtype: torch.dtype, logit_scale: float, layers: int) -> float:
    """The largest |Δ logit| between two computations of one model that is rounding of ``dtype`` (see the
    module docstring): ``max(1e-3, √layers · eps · logit_scale)``."""
    spread = math.sqrt(max(layers, 1)) * eps(dtype) * max(logit_scale, 1.0)
    return max(EQUIVALENCE_TOLERANCE, spread)


def divergence_tolerance(dtype: torch.dtype) -> float:
    """The largest |Δ| between a cached run and its recomputation that is rounding, relative to the compared
    tensor's largest magnitude (at least 1): √eps of the dtype — half its significant digits. fp32: 3.5e-4,
    bf16: 0.088, fp16: 0.031. Cached and recomputed runs differ by a few ulps per layer (other matrix shapes,
    other reduction orders); a cache bug moves values by a sizeable fraction of their scale."""
    return math.sqrt(eps(dtype))


def output_tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of an attention output kvviz recomputes against the implementation's: a few
    roundings of ``dtype`` (4·eps: 3.1e-2 in bf16, 3.9e-3 in fp16), never under 1e-3 (fp32's kernels)."""
    return max(EQUIVALENCE_TOLERANCE, OUTPUT_ROUNDINGS * eps(dtype))


def agreement(full: torch.Tensor, cached: torch.Tensor, dtype: torch.dtype, layers: int) -> dict:
    """The check's verdict on one run's logits, [n, vocab] each (``full``: recomputed without a cache).

    Returns the dtype, its tolerance for these logits, their scale, and per-position counts: ``top1_agree``
    (the same greedy token), ``topk_agree`` (the same :data:`TOP_K` tokens in the same order), and
    ``near_ties`` (positions where the ranking differs, and the first two candidates swapped are closer than
    the tolerance in the recomputation: rounding alone may swap them)."""
    full, cached = full.float(), cached.float()
    scale = max(full.abs().max().item(), cached.abs().max().item()) if full.numel() else 0.0
    tol = logit_tolerance(dtype, scale, layers)
    k = min(TOP_K, full.shape[-1])
    top_full, top_cached = full.topk(k, dim=-1), cached.topk(k, dim=-1).indices
    same_top1 = top_full.indices[:, 0] == top_cached[:, 0]
    same_topk = (top_full.indices == top_cached).all(dim=-1)
    # at the first rank where the rankings differ: how far above the cached run's candidate the recomputation
    # puts its own (>= 0; a pair closer than the tolerance is a coin toss of rounding)
    first = (top_full.indices != top_cached).int().argmax(dim=-1, keepdim=True)
    gaps = top_full.values.gather(-1, first) - full.gather(-1, top_cached.gather(-1, first))
    ties = (~same_topk) & (gaps[:, 0] < tol)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "tolerance": tol,
        "logit_scale": scale,
        "top_k": k,
        "top1_agree": int(same_top1.sum().item()),
        "topk_agree": int(same_topk.sum().item()),
        "near_ties": int(ties.sum().item()),
    }
