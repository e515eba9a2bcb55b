"""Simulated KV-cache quantization: FP8 (e4m3), INT8, INT4, INT3, INT2, per token / per channel, KIVI, and rotation.

Every quantizer is a round trip (quantize, then dequantize back to fp32), so attention can run on
what a quantized cache would hand back; the bytes a packed store would take (payload plus fp16
scales and zero points) are counted separately. Tensors are ``[..., T, D]`` (tokens × channels).

- per token: each token's vector is split into groups of ``group_size`` channels, one scale each;
- per channel: each channel is split into groups of ``group_size`` consecutive tokens (KIVI's keys);
- per tensor: one scale for the whole tensor (FP8 as serving engines often do it).

A spec with ``rotate`` first turns each head's vectors by an orthonormal Hadamard matrix H (QuaRot,
TurboQuant): a channel that is large for every token (the outlier key channels KIVI quantizes per
channel for) is spread over all channels, so per-token groups see no single huge channel. Attention
is unchanged by an orthogonal rotation applied to both queries and keys (q·k = qH·kH), so the round
trip quantizes in the rotated basis and turns back (x̂ = Q(xH)Hᵀ).

A ``residual`` window of the most recent tokens stays in full precision (KIVI). For per-channel
groups a group is quantized only once all its tokens are there, so up to ``group_size − 1`` more
recent tokens also wait in full precision — exactly what :mod:`kvviz.quant.cache` does as it generates.
The real model's queries, keys and values come from :mod:`kvviz.quant.model`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

FORMATS = {"fp8": 8, "int8": 8, "int4": 4, "int3": 3, "int2": 2}
AXES = ("token", "channel", "tensor")
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FULL_BYTES = 2  # the residual window and the baseline are counted as 16-bit (bf16/fp16), as served
META_BYTES = 2  # one fp16 scale (and, for INT, one fp16 zero point) per group


@dataclass(frozen=True)
class QuantSpec:
    """How one of K or V is stored: ``fmt`` in FORMATS, ``axis`` in AXES, group and recent window sizes.

    ``group_size=None`` means the whole axis (all channels of a token, all tokens of a channel).
    ``rotate``: quantize each head's vectors after an orthonormal Hadamard rotation (per token only).
    """

    fmt: str = "int2"
    axis: str = "channel"
    group_size: int | None = 32
    residual: int = 0
    rotate: bool = False

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"Unknown format {self.fmt!r}; choose one of {', '.join(FORMATS)}.")
        if self.axis not in AXES:
            raise ValueError(f"Unknown axis {self.axis!r}; choose one of {', '.join(AXES)}.")
        g = self.group_size
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
            raise ValueError(f"group_size must be a positive integer or None, got {g!r}.")
        if isinstance(self.residual, bool) or not isinstance(self.residual, int) or self.residual < 0:
            raise ValueError(f"residual must be an integer ≥ 0, got {self.residual!r}.")
        if self.rotate and self.axis != "token":
            raise ValueError("A rotation mixes the channels of each token: rotate only per-token quantization.")

    @property
    def bits(self) -> int:
        return FORMATS[self.fmt]

    @property
    def label(self) -> str:
        fmt = "FP8 e4m3" if self.fmt == "fp8" else self.fmt.upper()
        where = "per tensor" if self.axis == "tensor" else f"per {self.axis}"
        group = f", groups of {self.group_size}" if self.group_size and self.axis != "tensor" else ""
        window = f", last {self.residual} in full precision" if self.residual else ""
        turned = "Hadamard-rotated, " if self.rotate else ""
        return f"{turned}{fmt} {where}{group}{window}"


@dataclass(frozen=True)
class Scheme:
    """A cache recipe: one spec for keys, one for values."""

    name: str
    key: QuantSpec
    value: QuantSpec
    note: str = field(default="", compare=False)


def kivi(bits: int = 2, group_size: int = 32, residual: int = 32) -> Scheme:
    """KIVI (Liu et al. 2024): keys per channel, values per token, a recent window in full precision."""
    fmt = f"int{bits}"
    return Scheme(
        f"KIVI-{bits} (K per channel, V per token, window {residual})",
        QuantSpec(fmt, "channel", group_size, residual),
        QuantSpec(fmt, "token", group_size, residual),
        note="Liu et al. 2024",
    )


def preset_schemes(group_size: int = 32, residual: int = 32) -> list[Scheme]:
    """The comparison the Quantization view shows: FP8 and INT8 → INT4 → 2-bit, both groupings, then KIVI."""
    g = group_size

    def both(fmt: str, axis_k: str, axis_v: str, name: str, gs: int | None = g) -> Scheme:
        return Scheme(name, QuantSpec(fmt, axis_k, gs), QuantSpec(fmt, axis_v, gs))

    return [
        both("fp8", "tensor", "tensor", "FP8 e4m3, one scale per layer", None),
        both("fp8", "token", "token", "FP8 e4m3 per token"),
        both("int8", "token", "token", "INT8 per token"),
        both("int4", "token", "token", "INT4 per token"),
        both("int4", "channel", "token", "INT4 K per channel, V per token"),
        both("int2", "token", "token", "2-bit per token (K and V)"),
        both("int2", "channel", "channel", "2-bit per channel (K and V)"),
        both("int2", "channel", "token", "2-bit K per channel, V per token"),
        kivi(2, g, residual),
    ]


def rotation_schemes(bits: tuple[int, ...] = (4, 3, 2), group_size: int = 32) -> list[Scheme]:
    """At each bit width: KIVI's grouping (K per channel, V per token), plain per token, and Hadamard + per token.

    No full-precision window anywhere, so the three differ only in how each group is formed.
    """
    out = []
    for b in bits:
        fmt, g = f"int{b}", group_size
        out += [
            Scheme(
                f"INT{b} KIVI (K per channel, V per token)", QuantSpec(fmt, "channel", g), QuantSpec(fmt, "token", g)
            ),
            Scheme(f"INT{b} per token (K and V)", QuantSpec(fmt, "token", g), QuantSpec(fmt, "token", g)),
            Scheme(
                f"INT{b} Hadamard + per token (K and V)",
                QuantSpec(fmt, "token", g, rotate=True),
                QuantSpec(fmt, "token", g, rotate=True),
                note="QuaRot (Ashkboos et al. 2024), TurboQuant (Zandieh et al. 2025)",
            ),
        ]
    return out


# ---- the rotation --------------------------------------------------------------------------------
def hadamard(d: int, device=None) -> torch.Tensor:
    """The orthonormal Hadamard matrix [d, d] (Sylvester's construction, scaled by 1/√d; H Hᵀ = I)."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"A Hadamard rotation needs a power-of-two head dimension, got {d}.")
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(d)).to(device)


def rotated(x: torch.Tensor) -> torch.Tensor:
    """Each vector of ``x`` [..., D] turned by the Hadamard rotation: x H (fp32)."""
    return x.float() @ hadamard(x.shape[-1], x.device)


def unrotated(x: torch.Tensor) -> torch.Tensor:
    """The inverse turn: x Hᵀ (fp32)."""
    return x.float() @ hadamard(x.shape[-1], x.device).T


# ---- the round trip ----------------------------------------------------------------------------
def quantized_prefix(n_tokens: int, spec: QuantSpec) -> int:
    """How many of the oldest tokens are stored quantized (the rest wait in full precision)."""
    n = max(0, n_tokens - spec.residual)
    if spec.axis == "channel" and spec.group_size:
        n -= n % spec.group_size  # a channel group is quantized once all its tokens are there
    return n


def _grouped(x: torch.Tensor, spec: QuantSpec) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """View ``x`` [..., T, D] as [..., groups, group] along the spec's axis, plus the inverse."""
    *lead, t, d = x.shape
    if spec.axis == "tensor":
        return x.reshape(1, -1), lambda y: y.reshape(x.shape)
    if spec.axis == "token":
        g = spec.group_size or d
        if d % g:
            raise ValueError(f"group_size {g} does not divide the head dimension {d}.")
        return x.reshape(*lead, t, d // g, g), lambda y: y.reshape(x.shape)  # [..., T, D/g, g]
    g = spec.group_size or t
    if t % g:
        raise ValueError(f"{t} tokens do not fill whole groups of {g}: quantize aligned blocks.")
    xt = x.transpose(-1, -2)  # [..., D, T]
    return xt.reshape(*lead, d, t // g, g), lambda y: y.reshape(*lead, d, t).transpose(-1, -2)


def round_trip(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Quantize ``x`` [..., T, D] with ``spec`` (ignoring its window) and dequantize back to fp32.

    A rotating spec quantizes ``x H`` and turns the result back (the error is the same in both bases).
    """
    if spec.rotate:
        return unrotated(round_trip(rotated(x), dataclasses.replace(spec, rotate=False)))
    if x.numel() == 0:
        return x.float()
    xg, ungroup = _grouped(x.float(), spec)
    if spec.fmt == "fp8":  # symmetric: one scale maps the group's absmax onto e4m3's largest value
        scale = xg.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
        y = (xg / scale).to(torch.float8_e4m3fn).float() * scale
    else:  # asymmetric min-max with a zero point, as KIVI stores it
        levels = 2**spec.bits - 1
        lo, hi = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True)
        scale = (hi - lo) / levels
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        y = ((xg - lo) / scale).round().clamp(0, levels) * scale + lo
    return ungroup(y)


def simulate(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """What a cache holding ``x`` [..., T, D] under ``spec`` returns: quantized prefix + exact recent window."""
    n = quantized_prefix(x.shape[-2], spec)
    out = x.float().clone()
    if n:
        out[..., :n, :] = round_trip(x[..., :n, :], spec)
    return out


# ---- bytes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredBytes:
    """Bytes a packed cache would hold: low-bit payload, fp16 scales/zero points, 16-bit recent window."""

    payload: int
    meta: int
    residual: int
    groups: int
    quantized_tokens: int

    @property
    def total(self) -> int:
        return self.payload + self.meta + self.residual


def stored_bytes(shape: tuple[int, ...], spec: QuantSpec) -> StoredBytes:
    """Bytes of a tensor of ``shape`` [..., T, D] stored under ``spec`` (payload rounded up to whole bytes)."""
    *lead, t, d = shape
    rows = math.prod(lead)
    n = quantized_prefix(t, spec)
    if n == 0:
        groups = 0
    elif spec.axis == "tensor":
        groups = 1
    elif spec.axis == "token":
        groups = rows * n * (d // (spec.group_size or d))
    else:
        groups = rows * d * (n // (spec.group_size or n))
    per_group = META_BYTES * (1 if spec.fmt == "fp8" else 2)
    payload = -(-rows * n * d * spec.bits // 8)
    return StoredBytes(payload, groups * per_group, rows * (t - n) * d * FULL_BYTES, groups, n)


def bits_per_element(spec: QuantSpec, head_dim: int, tokens: int) -> float:
    """Average stored bits per cached element, scales and window included."""
    sb = stored_bytes((1, tokens, head_dim), spec)
    return 8 * sb.total / (tokens * head_dim)


# ---- errors --------------------------------------------------------------------------------------
def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """‖approx − exact‖ / ‖exact‖ (Frobenius), a unitless fraction."""
    den = exact.float().norm().item()
    return (approx.float() - exact.float()).norm().item() / den if den else 0.0


def attention_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
    """Causal attention of every query: q [Hq, T, D], k/v [Hkv, T, D] → [Hq, T, D] (GQA by repeat)."""
    group = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(group, dim=0)  # [Hq, T, D]
    v = v.repeat_interleave(group, dim=0)
    return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scaling)[0]
