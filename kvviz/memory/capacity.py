"""What fits and how fast: KV budget, batch capacity, longest context, decode-step bytes and time.

:mod:`kvviz.memory.report` puts these together for one request (the CLI's and the tab's report). One model instance is spread over ``gpus`` GPUs by tensor parallelism (``tp`` defaults to
``gpus``): the weights are stored once, GPU memory and bandwidth add up. GPU memory and weights
are in decimal GB, as vendors and the chapter quote them; cache sizes in bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvviz.memory.estimate import KVDtype, estimate
from kvviz.memory.layout import PRESET_DIR, CacheLayout

WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "mxfp4": 0.5}


@dataclass(frozen=True)
class GPU:
    """A GPU preset: memory in decimal GB, memory bandwidth in decimal TB/s."""

    name: str
    memory_gb: float
    bandwidth_tbps: float
    source: str = ""


def gpu_presets() -> dict[str, GPU]:
    """The bundled GPUs by name (H100, H200, A100, L4, T4, RTX 4090)."""
    data = json.loads((PRESET_DIR / "gpus.json").read_text())
    return {g["name"]: GPU(**g) for g in data["gpus"]}


def find_gpu(name: str) -> GPU:
    """A preset by name or unique prefix, case-insensitive (``'h100'`` → H100 80GB (SXM))."""
    key = name.strip().lower()
    gpus = gpu_presets()
    hits = [g for n, g in gpus.items() if n.lower() == key] or [
        g for n, g in gpus.items() if n.lower().startswith(key) or n.lower().replace(" ", "").startswith(key)
    ]
    if len(hits) != 1:
        raise ValueError(f"Unknown GPU {name!r}; choose one of: {', '.join(gpus)}.")
    return hits[0]


def weight_bytes(num_parameters: int, dtype: str = "bf16") -> int:
    """Bytes of the weights: parameters × bytes per parameter in ``dtype``."""
    key = dtype.strip().lower().replace("bfloat16", "bf16").replace("float16", "fp16").replace("float32", "fp32")
    if key not in WEIGHT_BYTES:
        raise ValueError(f"Unknown weight dtype {dtype!r}; choose one of {', '.join(WEIGHT_BYTES)}.")
    if num_parameters is None or num_parameters <= 0:
        raise ValueError("The parameter count is unknown: give the weights in GB instead.")
    return int(num_parameters * WEIGHT_BYTES[key])


# ---- budget and capacity -----------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """GPU memory → what is left for the KV cache (all in bytes)."""

    gpus: int
    gpu_mem_bytes: int  # per GPU
    total_mem_bytes: int
    reserve: float  # fraction kept for activations, workspace, CUDA graphs
    usable_bytes: int
    weight_bytes: int
    kv_budget_bytes: int


def kv_budget(gpus: int, gpu_mem_gb: float, weight_bytes: int, reserve: float = 0.1) -> Budget:
    """GPUs × memory, minus the reserve fraction, minus the weights."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}.")
    if not (gpu_mem_gb > 0):
        raise ValueError(f"GPU memory must be positive, got {gpu_mem_gb!r} GB.")
    if not (0 <= reserve < 1):
        raise ValueError(f"reserve is a fraction in [0, 1), got {reserve!r}.")
    if weight_bytes < 0:
        raise ValueError("weights cannot be negative.")
    per_gpu = round(gpu_mem_gb * 1e9)
    total = gpus * per_gpu
    usable = round(total * (1 - reserve))
    budget = usable - int(weight_bytes)
    if budget <= 0:
        raise ValueError(
            f"The weights ({weight_bytes / 1e9:,.1f} GB) do not fit in the {usable / 1e9:,.1f} GB "
            f"left after the {reserve:.0%} reserve on {gpus} × {gpu_mem_gb:g} GB: add GPUs or "
            "quantize the weights."
        )
    return Budget(gpus, per_gpu, total, reserve, usable, int(weight_bytes), budget)


def max_sequences(
    layout: CacheLayout, budget_bytes: int, context: int, kv_dtype: str | KVDtype = "bf16", tp: int = 1, **kw
) -> int:
    """Most sequences of ``context`` tokens whose cache fits in the budget."""
    per_seq = estimate(layout, context, 1, kv_dtype, tp, **kw).total_bytes
    return int(budget_bytes // per_seq) if per_seq else 0


def max_context(
    layout: CacheLayout, budget_bytes: int, batch: int = 1, kv_dtype: str | KVDtype = "bf16", tp: int = 1, **kw
) -> int | None:
    """Longest context at which ``batch`` sequences fit; ``None`` when windows cap the cache below it."""

    def total(t: int) -> int:
        return estimate(layout, t, batch, kv_dtype, tp, **kw).total_bytes

    if total(0) > budget_bytes:
        return 0
    growing = [layer for layer in layout.layers if layer.vectors and not layer.window]
    saturation = max((layer.window for layer in layout.layers if layer.window), default=0)
    if not growing and total(saturation) <= budget_bytes:
        return None
    hi = saturation + 1
    while total(hi) <= budget_bytes:
        hi *= 2
    lo = 0  # total(lo) fits, total(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid) <= budget_bytes else (lo, mid)
    return lo


# ---- one decode step -----------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeStep:
    """Bytes every decode step reads and the time at full memory bandwidth: a lower bound on TPOT."""

    weight_bytes: int
    kv_bytes: int
    bandwidth_bytes_per_s: float  # all GPUs together
    ms_weights: float
    ms_kv: float

    @property
    def ms_total(self) -> float:
        return self.ms_weights + self.ms_kv


def decode_step(weight_bytes: int, kv_bytes: int, bandwidth_tbps: float, gpus: int = 1) -> DecodeStep:
    """Weights once (shared by the batch) plus every sequence's cache, over ``gpus × bandwidth``."""
    if not (bandwidth_tbps > 0):
        raise ValueError(f"bandwidth must be positive, got {bandwidth_tbps!r} TB/s.")
    bw = gpus * bandwidth_tbps * 1e12
    return DecodeStep(int(weight_bytes), int(kv_bytes), bw, weight_bytes / bw * 1e3, kv_bytes / bw * 1e3)
