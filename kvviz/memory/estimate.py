"""KV-cache arithmetic: bytes per token, per sequence and per batch, for any architecture.

The chapter's formula, ``KV bytes = 2 · n_layers · n_kv · d_h · b`` per token, made right for
sliding windows, hybrids, MLA, fixed-state layers, quantized KV and tensor parallelism::

    from kvviz.memory.estimate import estimate
    from kvviz.memory.layout import cache_layout
    from kvviz.units import format_bytes
    est = estimate(cache_layout("Llama-3-70B"), context=8192, kv_dtype="bf16")
    format_bytes(est.bytes_per_token), format_bytes(est.bytes_per_sequence)   # '320 KiB', '2.5 GiB'

Capacity and decode-time estimates live in :mod:`kvviz.memory.capacity`; reading configs in
:mod:`kvviz.memory.layout`. JSON carries bytes; display uses binary units for cache sizes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from kvviz.memory.layout import (
    CacheLayout,
    LayerSpec,
    cache_layout,
)

__all__ = [
    "KV_DTYPES",
    "Estimate",
    "KVDtype",
    "LayerBytes",
    "Variant",
    "LayerGroup",
    "attention_variants",
    "layer_groups",
    "estimate",
    "resolve_kv_dtype",
    "live_cache_bytes_formula",
    "tokens_held",
]

KV_DTYPES = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "int2": 2}
_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}
_FLOATS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class KVDtype:
    """How one cached element is stored: ``bits`` each, plus an optional scale and zero point per group.

    Low-bit caches (KIVI, HQQ, quanto) keep one scale and one zero point, each ``scale_bytes``
    (fp16 = 2), for every ``group_size`` consecutive elements of a stored vector.
    """

    name: str
    bits: int
    group_size: int | None = None
    scale_bytes: int = 2

    def vector_bytes(self, length: int) -> int:
        """Bytes of one stored vector of ``length`` elements (payload rounded up to whole bytes)."""
        payload = -(-length * self.bits // 8)
        if not self.group_size:
            return payload
        return payload + -(-length // self.group_size) * 2 * self.scale_bytes

    @property
    def label(self) -> str:
        return f"{self.name} (+fp16 scale/zero per {self.group_size})" if self.group_size else self.name


def resolve_kv_dtype(name: str | KVDtype | int, group_size: int | None = None) -> KVDtype:
    """``'bf16'`` → KVDtype; an int is read as bytes per element (4 → fp32, 2 → bf16, 1 → fp8)."""
    if isinstance(name, KVDtype):
        return name
    if isinstance(name, int) and not isinstance(name, bool):
        by_bytes = {4: "fp32", 2: "bf16", 1: "fp8"}
        if name not in by_bytes:
            raise ValueError(f"{name} bytes per element is not a KV dtype; use 4, 2 or 1 (or a name).")
        name = by_bytes[name]
    key = _ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in KV_DTYPES:
        raise ValueError(f"Unknown KV dtype {str(name)[:40]!r}; choose one of {', '.join(KV_DTYPES)}.")
    if group_size is not None:
        if key in _FLOATS:
            raise ValueError(f"{key} needs no per-group scales; group_size applies to fp8/int8/int4/int2.")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}.")
    return KVDtype(key, KV_DTYPES[key], group_size or None)


def state_dtype_for(dtype: KVDtype) -> KVDtype:
    """Fixed states (SSM / linear attention) stay in the activation dtype when K/V are quantized."""
    return dtype if dtype.name in _FLOATS else KVDtype("bf16", 16)


# ---- per layer ---------------------------------------------------------------------------------
def tokens_held(layer: LayerSpec, seen: int, keep: str = "transformers") -> int:
    """Tokens a layer's cache holds after ``seen`` tokens went through it.

    Full and MLA layers hold all of them. A sliding-window layer of window ``W`` attends to the
    last ``W`` tokens including the new one, so between steps it needs only ``W - 1``: transformers'
    ``DynamicSlidingWindowLayer`` keeps exactly ``min(seen, W - 1)`` (``keep="transformers"``, the
    default, which matches the live cache's tensor bytes). ``keep="window"`` counts ``min(seen, W)``,
    the chapter's "the last W tokens" (and what a cache allocated for the step's own token holds).
    Chunked-attention layers (Llama-4) are kept the same way with ``W`` = ``attention_chunk_size``,
    as transformers maps them onto the same cache layer. Fixed-state layers hold no tokens.
    """
    if keep not in ("transformers", "window"):
        raise ValueError(f"keep must be 'transformers' or 'window', not {keep!r}.")
    if not layer.vectors:
        return 0
    if layer.window:
        return min(seen, layer.window - 1 if keep == "transformers" else layer.window)
    return seen


def layer_bytes_per_token(layer: LayerSpec, dtype: KVDtype) -> int:
    """Bytes one token adds to this layer's cache (0 for fixed-state and cache-less layers)."""
    return sum(count * dtype.vector_bytes(length) for length, count in layer.vectors)


@dataclass(frozen=True)
class LayerBytes:
    """One layer of one sequence at a context: what it holds and what that costs."""

    index: int
    kind: str
    layer_type: str
    tokens_held: int
    bytes: int  # per sequence, unreplicated
    bytes_per_token: int
    state_bytes: int


# ---- totals ------------------------------------------------------------------------------------
def _tp_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """KV heads each GPU stores: ``kv/tp`` when they split evenly, 1 (replicated) when ``kv < tp``."""
    if kv_heads % tp == 0:
        return kv_heads // tp
    if tp % kv_heads == 0:
        return 1
    valid = sorted({d for d in range(1, kv_heads + 1) if kv_heads % d == 0} | {kv_heads * m for m in (2, 4, 8)})
    raise ValueError(
        f"Tensor parallelism {tp} cannot split {kv_heads} KV heads: one must divide the other "
        f"(e.g. TP = {', '.join(map(str, valid))})."
    )


@dataclass(frozen=True)
class Estimate:
    """KV cache of ``batch`` sequences of ``context`` tokens (all sizes in bytes)."""

    name: str
    attention: str
    kv_dtype: KVDtype  # how an element is stored, with its scale/zero group: every view of the estimate reads it
    context: int
    batch: int
    tp: int
    bytes_per_token: int  # a token held by every layer (no window applied)
    bytes_per_sequence: int  # at ``context``, after windows, plus fixed states
    total_bytes: int  # × batch × replication across tensor-parallel GPUs
    per_gpu_bytes: int
    replication: float  # total_bytes / (batch × bytes_per_sequence)
    layers: tuple[LayerBytes, ...]

    @property
    def group_size(self) -> int | None:
        """Scale/zero group of a low-bit cache, if counted."""
        return self.kv_dtype.group_size

    def layers_json(self) -> list[dict]:
        return [{"kind": lb.kind, "tokens_held": lb.tokens_held, "bytes": lb.bytes} for lb in self.layers]

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(kv_dtype=self.kv_dtype.name, group_size=self.group_size, layers=self.layers_json())
        return out


def _check_count(value, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer ≥ {minimum}, got {value!r}.")
    return value


def estimate(
    layout: CacheLayout,
    context: int,
    batch: int = 1,
    kv_dtype: str | KVDtype = "bf16",
    tp: int = 1,
    group_size: int | None = None,
    keep: str = "transformers",
    state_dtype: str | KVDtype | None = None,
) -> Estimate:
    """Bytes of the cache for ``batch`` sequences that have each seen ``context`` tokens.

    With tensor parallelism each GPU stores ``kv_heads / tp`` heads of every layer; when there are
    fewer KV heads than GPUs (and for MLA's single shared latent) each GPU keeps a full copy of a
    head, so the total grows by ``tp / kv_heads`` — the chapter's "TP=16 with 8 KV heads" pitfall.
    Fixed states are split across GPUs without replication.
    """
    dtype = resolve_kv_dtype(kv_dtype, group_size)
    sdtype = resolve_kv_dtype(state_dtype) if state_dtype is not None else state_dtype_for(dtype)
    _check_count(context, "context", 0)
    _check_count(batch, "batch", 1)
    _check_count(tp, "tp", 1)
    rows, total = [], 0
    groups: dict[tuple, tuple[int, int, int, int]] = {}  # identical layers are sized once
    for layer in layout.layers:
        key = (layer.vectors, layer.kv_heads, layer.window, layer.state_elements)
        if key not in groups:
            per_token = layer_bytes_per_token(layer, dtype)
            held = tokens_held(layer, context, keep)
            state = -(-layer.state_elements * sdtype.bits // 8)
            kv = held * per_token  # every head stores the same vectors, so kv // kv_heads is exact
            gpu_kv = batch * tp * _tp_heads_per_gpu(layer.kv_heads, tp) * (kv // layer.kv_heads) if kv else 0
            groups[key] = (per_token, held, state, gpu_kv + batch * state)
        per_token, held, state, layer_total = groups[key]
        rows.append(
            LayerBytes(layer.index, layer.kind, layer.layer_type, held, held * per_token + state, per_token, state)
        )
        total += layer_total
    per_seq = sum(r.bytes for r in rows)
    return Estimate(
        name=layout.name,
        attention=layout.attention,
        kv_dtype=dtype,
        context=context,
        batch=batch,
        tp=tp,
        bytes_per_token=sum(r.bytes_per_token for r in rows),
        bytes_per_sequence=per_seq,
        total_bytes=total,
        per_gpu_bytes=-(-total // tp),
        replication=total / (batch * per_seq) if per_seq else 1.0,
        layers=tuple(rows),
    )


def live_cache_bytes_formula(config, seq_len: int, dtype_bytes: int | str = 2, batch: int = 1) -> dict:
    """What a transformers ``DynamicCache`` should hold after ``seq_len`` tokens: per layer and total.

    For comparison with ``sum(keys.numel() * element_size + values.numel() * element_size)`` of the
    real cache; ``dtype_bytes`` is the model's element size (4 for fp32 on CPU). Returns
    ``{"tokens_held": [...], "layer_bytes": [...], "total": int}``.
    """
    layout = config if isinstance(config, CacheLayout) else cache_layout(config)
    dtype = resolve_kv_dtype(dtype_bytes)
    est = estimate(layout, context=seq_len, batch=batch, kv_dtype=dtype, state_dtype=dtype)
    layer_bytes = [batch * lb.tokens_held * lb.bytes_per_token for lb in est.layers]
    return {
        "tokens_held": [lb.tokens_held for lb in est.layers],
        "layer_bytes": layer_bytes,
        "state_bytes": [batch * lb.state_bytes for lb in est.layers],
        "total": sum(layer_bytes),
    }


# ---- the chapter's architecture table, for any shape -------------------------------------------
@dataclass(frozen=True)
class Variant:
    """One attention design over the model's layers: what a token costs and a sequence holds."""

    attention: str  # "MHA", "GQA", "MQA", "MLA"
    kv_heads: int  # 0 for MLA (one shared latent)
    bytes_per_token: int
    bytes_per_sequence: int
    actual: bool  # the design the model really uses
    detail: str  # the per-token arithmetic, e.g. "2 × 80 layers × 8 heads × 128 × 2 B"


def attention_variants(
    layout: CacheLayout, context: int, kv_dtype: str | KVDtype = "bf16", latent: tuple[int, int] | None = None
) -> list[Variant]:
    """MHA / GQA / MQA / MLA on this model's layers (windows and states kept as they are).

    Key and value head sizes come from the model (for MLA models: ``qk_nope + qk_rope`` for keys and
    ``v_head_dim`` for values, the chapter's plain-MHA counterfactual). A design the model does not
    use is marked hypothetical: GQA with 8 KV heads, and for non-MLA models an MLA latent of
    ``latent = (kv_lora_rank, qk_rope_head_dim)``, by default DeepSeek-V2's ratios (4·d_h, d_h/2).
    """
    dtype = resolve_kv_dtype(kv_dtype)
    b = dtype.bits / 8
    q = layout.num_attention_heads
    dk = layout.head_dim
    dv = layout.mla["v_head_dim"] if layout.mla else dk
    n_attn = sum(1 for layer in layout.layers if layer.vectors)
    index = next((layer.vectors[2][0] for layer in layout.layers if layout.mla and len(layer.vectors) > 2), 0)
    rank, rope = (
        (layout.mla["kv_lora_rank"], layout.mla["qk_rope_head_dim"]) if layout.mla else (latent or (4 * dk, dk // 2))
    )
    actual = layout.attention
    rows = [("MHA", q)]
    if actual == "GQA":
        rows.append(("GQA", layout.num_key_value_heads))
    elif q > 8 and q % 8 == 0:
        rows.append(("GQA", 8))
    rows += [("MQA", 1), ("MLA", 0)]
    out = []
    vectors: tuple[tuple[int, int], ...]
    for name, kv in rows:
        if name == "MLA":  # with DeepSeek sparse attention, the indexer's key per token too
            vectors, heads = ((rank, 1), (rope, 1), *(((index, 1),) if index else ())), 1
            detail = f"({rank} + {rope}{f' + {index} indexer' if index else ''}) × {n_attn} layers × {b:g} B"
        else:
            vectors, heads = (((dk, 2 * kv),) if dk == dv else ((dk, kv), (dv, kv))), kv
            h = f"{kv} head{'s' if kv > 1 else ''}"
            detail = (
                f"2 × {n_attn} layers × {h} × {dk} × {b:g} B"
                if dk == dv
                else f"{h} × ({dk} + {dv}) × {n_attn} layers × {b:g} B"
            )
        if dtype.group_size:
            detail += f" + scales/zeros per {dtype.group_size}"
        layers = tuple(
            replace(layer, vectors=vectors, kv_heads=heads) if layer.vectors else layer for layer in layout.layers
        )
        est = estimate(replace(layout, layers=layers), context, kv_dtype=dtype)
        out.append(
            Variant(
                name,
                kv,
                est.bytes_per_token,
                est.bytes_per_sequence,
                name == actual and (name != "GQA" or kv == layout.num_key_value_heads),
                detail,
            )
        )
    return out


# ---- the formula, with the model's numbers -----------------------------------------------------
@dataclass(frozen=True)
class LayerGroup:
    """Layers that store the same thing: the formula term they contribute, with numbers."""

    kind: str
    count: int
    window: int | None
    tokens_held: int
    per_token_expr: str  # e.g. "2 × 8 KV heads × 128 × 2 B" (one layer)
    bytes_per_token: int  # all layers of the group
    bytes: int  # all layers of the group, one sequence at the context


def layer_groups(layout: CacheLayout, est: Estimate) -> list[LayerGroup]:
    """Group layers by what they store, in order of first appearance (full, sliding, MLA, state...)."""
    b = f"{est.kv_dtype.bits / 8:g} B"
    groups: dict[tuple, list] = {}
    for spec, lb in zip(layout.layers, est.layers):
        groups.setdefault((spec.kind, spec.window, spec.vectors, spec.state_elements), []).append((spec, lb))
    out = []
    for (kind, window, vectors, state), items in groups.items():
        spec, lb = items[0]
        if kind == "mla":
            extra = f" + {vectors[2][0]} indexer" if len(vectors) > 2 else ""
            expr = f"({vectors[0][0]} + {vectors[1][0]}{extra}) × {b}"
        elif kind == "shared":
            expr = "reuses an earlier layer's K/V: nothing of its own"
        elif vectors:
            length, count = vectors[0]
            expr = f"2 × {count // 2} KV head{'s' if count > 2 else ''} × {length} × {b}"
            if len(vectors) > 1:  # a DSA indexer key beside per-head K/V
                expr += f" + {vectors[1][0]} indexer × {b}"
        else:
            expr = f"fixed state of {state:,} elements" if state else "no cache"
        if est.group_size and vectors:
            expr += f" + fp16 scale & zero per {est.group_size}"
        out.append(
            LayerGroup(
                kind,
                len(items),
                window,
                lb.tokens_held,
                expr,
                sum(x.bytes_per_token for _, x in items),
                sum(x.bytes for _, x in items),
            )
        )
    return out
