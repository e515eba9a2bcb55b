"""One memory request's report: sizes, capacity when GPU memory is given, decode time when bandwidth is.

The chapter's serving arithmetic (8 × H100 80 GB, 10% reserve, 140 GB of Llama-3-70B weights →
436 GB ≈ 406 GiB of KV budget → 162 sequences at 8K, 10 at 128K; 5.2 ms to read the weights vs
16 ms to read the KV at 162 × 8K)::

    from kvviz.memory.layout import cache_layout
    from kvviz.memory.report import MemoryRequest, report, summary
    r = report(MemoryRequest(cache_layout("Llama-3-70B"), context=8192, batch=162, gpus=8, gpu_mem_gb=80,
                             reserve=0.1, weights_gb=140, bandwidth_tbps=3.35))
    r.capacity.max_sequences, r.decode.ms_kv   # 162, 16.2
    print(summary(r))                          # what `python -m kvviz memory` prints

``CapacityReport.to_json()`` is the JSON of ``python -m kvviz memory --json`` and of the ``/memory``
endpoint; :func:`summary` is the one text of it (plain for the CLI, Markdown for the tab).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvviz.memory.capacity import Budget, DecodeStep, decode_step, kv_budget, max_context, max_sequences, weight_bytes
from kvviz.memory.estimate import Estimate, KVDtype, estimate, layer_groups
from kvviz.memory.layout import CacheLayout
from kvviz.units import format_bytes, format_gb


@dataclass(frozen=True)
class Capacity:
    """What fits in the KV budget: sequences at the requested context, the longest context for the batch."""

    budget: Budget
    max_sequences: int
    max_context: int | None  # None: windows cap the cache below the budget at any context
    fits: bool  # the requested batch at the requested context


@dataclass(frozen=True)
class CapacityReport:
    """Sizes of the requested cache; ``capacity`` when GPU memory was given, ``decode`` when bandwidth was."""

    layout: CacheLayout
    kv_dtype: KVDtype
    estimate: Estimate
    weight_bytes: int | None = None
    capacity: Capacity | None = None
    decode: DecodeStep | None = None

    def to_json(self) -> dict:
        """The CLI's ``--json`` object: all sizes in bytes; capacity and decode fields only when computed."""
        layout, est = self.layout, self.estimate
        out = {
            "model": layout.name,
            "model_type": layout.model_type,
            "attention": est.attention,
            "kv_dtype": self.kv_dtype.name,
            "group_size": self.kv_dtype.group_size,
            "context": est.context,
            "batch": est.batch,
            "tp": est.tp,
            "num_layers": layout.num_layers,
            "num_key_value_heads": layout.num_key_value_heads,
            "head_dim": layout.head_dim,
            "max_position_embeddings": layout.max_position_embeddings,
            "bytes_per_token": est.bytes_per_token,
            "bytes_per_sequence": est.bytes_per_sequence,
            "total_bytes": est.total_bytes,
            "per_gpu_bytes": est.per_gpu_bytes,
            "replication": est.replication,
            "layers": est.layers_json(),
        }
        if self.weight_bytes is not None:
            out["weight_bytes"] = self.weight_bytes
        if self.capacity is not None:
            out.update({k: v for k, v in asdict(self.capacity.budget).items() if k != "weight_bytes"})
            out.update(
                max_sequences=self.capacity.max_sequences,
                max_context=self.capacity.max_context,
                fits=self.capacity.fits,
            )
        if self.decode is not None:
            d = self.decode
            out.update(
                bandwidth_bytes_per_s=d.bandwidth_bytes_per_s,
                decode_ms_weights=d.ms_weights,
                decode_ms_kv=d.ms_kv,
                decode_ms_total=d.ms_total,
            )
        return out


BF16 = KVDtype("bf16", 16)


@dataclass(frozen=True)
class MemoryRequest:
    """One memory question, every part by name: the cache (layout, context, batch, storage with its scale
    group, TP), then the GPUs it must fit on (capacity with ``gpu_mem_gb``, decode time with
    ``bandwidth_tbps``; both need the weights: ``weights_gb``, or the parameter count × ``weight_dtype``).
    The tab, the CLI and ``/memory`` build one, and every number and chart of the answer reads it."""

    layout: CacheLayout
    context: int
    batch: int = 1
    kv_dtype: KVDtype = BF16
    tp: int | None = None  # None: all the GPUs
    gpus: int | None = None  # None: one
    gpu_mem_gb: float | None = None
    reserve: float = 0.1
    weights_gb: float | None = None
    weight_dtype: str = "bf16"
    bandwidth_tbps: float | None = None

    @property
    def gpu_count(self) -> int:
        return 1 if self.gpus is None else self.gpus

    @property
    def tp_degree(self) -> int:
        return self.gpu_count if self.tp is None else self.tp


def report(req: MemoryRequest) -> CapacityReport:
    """Sizes for ``batch`` × ``context``; capacity with ``gpu_mem_gb``, decode time with ``bandwidth_tbps``."""
    layout, context, batch, dtype, tp = req.layout, req.context, req.batch, req.kv_dtype, req.tp_degree
    gpus_n = req.gpu_count
    est = estimate(layout, context, batch, dtype, tp)
    if req.gpu_mem_gb is None and req.bandwidth_tbps is None:
        return CapacityReport(layout, dtype, est)
    if req.weights_gb is not None:
        if not (req.weights_gb >= 0):
            raise ValueError(f"weights must be ≥ 0 GB, got {req.weights_gb!r}.")
        w = round(req.weights_gb * 1e9)
    elif layout.num_parameters:
        w = weight_bytes(layout.num_parameters, req.weight_dtype)
    else:
        raise ValueError("The config has no parameter count: give the weights in GB (--weights-gb).")
    capacity = None
    if req.gpu_mem_gb is not None:
        b = kv_budget(gpus_n, req.gpu_mem_gb, w, req.reserve)
        capacity = Capacity(
            b,
            max_sequences(layout, b.kv_budget_bytes, context, dtype, tp),
            max_context(layout, b.kv_budget_bytes, batch, dtype, tp),
            est.total_bytes <= b.kv_budget_bytes,
        )
    bw = req.bandwidth_tbps
    step = decode_step(w, est.total_bytes, bw, gpus_n) if bw is not None else None
    return CapacityReport(layout, dtype, est, w, capacity, step)


def heads_phrase(layout: CacheLayout) -> str:
    """What the cache is made of, in words: MLA caches one latent per layer and no heads at all, so its
    query-head count must not be printed as "KV heads" (the chapter's pitfall "forgetting MLA's shape")."""
    if layout.mla:
        m = layout.mla
        return (
            f"{layout.num_attention_heads} query heads, but no KV heads in the cache: one "
            f"{m['kv_lora_rank']}-dim latent + {m['qk_rope_head_dim']}-dim RoPE key per token per layer"
        )
    return (
        f"{layout.num_attention_heads} query heads / {layout.num_key_value_heads} KV heads, head_dim {layout.head_dim}"
    )


def copies_phrase(layout: CacheLayout, est: Estimate, heads: str) -> str:
    """Why tensor parallelism multiplies the total: ``heads`` (KV heads stored on several GPUs), or for MLA,
    which has no heads to split, its latent on every rank."""
    if layout.mla:
        return f"one latent per layer, copied on each of the {est.tp} TP ranks"
    return heads


def _configured(r: CapacityReport, ctx_max: int) -> str:
    """The context the config is set for, with one sequence's cache there, so a long-context example (the
    chapter's 128K on Llama-3-70B) is never read as that model's own setting."""
    at = estimate(r.layout, ctx_max, 1, r.kv_dtype, r.estimate.tp).bytes_per_sequence
    return f" (the config is set for {ctx_max:,} tokens, where one sequence holds {format_bytes(at)})"


def summary(r: CapacityReport, markdown: bool = False) -> str:
    """The report in words: plain lines with the layer groups (CLI), or Markdown paragraphs (the tab, whose
    formula panel shows the layers)."""

    def b(text: str) -> str:
        return f"**{text}**" if markdown else text

    layout, est = r.layout, r.estimate
    lines = []
    if not markdown:
        dtype = r.kv_dtype
        lines.append(
            f"{layout.name} ({layout.model_type}): {est.attention}, {layout.num_layers} layers, "
            f"{heads_phrase(layout)}, KV dtype {dtype.name}"
            + (f" (+fp16 scale & zero per {dtype.group_size})" if dtype.group_size else "")
        )
        for g in layer_groups(layout, est):
            held = f", {g.tokens_held:,} tokens held" + (f" (window {g.window})" if g.window else "")
            lines.append(
                f"  {g.count} {g.kind} layer{'s' if g.count > 1 else ''}: {g.per_token_expr} per token per "
                f"layer{held} → {g.bytes:,} bytes ({format_bytes(g.bytes)}) per sequence"
            )
    seqs = f"{est.batch:,} sequence{'s' if est.batch > 1 else ''}"
    copies = (
        f"; {copies_phrase(layout, est, f'each KV head is stored on {est.replication:g} GPUs')}, so × {est.replication:g}"
        if est.replication != 1
        else ""
    )
    lines.append(
        f"Per token (every layer): {est.bytes_per_token:,} B = {b(format_bytes(est.bytes_per_token) + '/token')}"
    )
    lines.append(
        f"Per sequence at {est.context:,} tokens: {est.bytes_per_sequence:,} B = "
        f"{b(format_bytes(est.bytes_per_sequence) + '/sequence')}"
    )
    lines.append(
        f"All GPUs together for a batch of {est.batch:,} at TP {est.tp}{copies}: {est.total_bytes:,} B = "
        f"{b(format_bytes(est.total_bytes) + ' in total')} ({format_bytes(est.per_gpu_bytes)} per GPU)"
    )
    if r.capacity is not None:
        cap, budget = r.capacity, r.capacity.budget
        mc, ctx_max = cap.max_context, layout.max_position_embeddings
        lines.append(
            f"Capacity: {budget.gpus} × {format_gb(budget.gpu_mem_bytes)} = {format_gb(budget.total_mem_bytes)}, "
            f"{budget.reserve:.0%} reserve → {format_gb(budget.usable_bytes)}, minus weights "
            f"{format_gb(budget.weight_bytes)} → {b(f'KV budget {format_gb(budget.kv_budget_bytes)} = ' + format_bytes(budget.kv_budget_bytes))}"
            f" → {b(f'{cap.max_sequences:,} sequences')} at {est.context:,} tokens; {seqs} "
            f"fit{'s' if est.batch == 1 else ''} up to "
            + ("any context (windows cap the cache)" if mc is None else b(f"{mc:,} tokens"))
            + (_configured(r, ctx_max) if mc and ctx_max and mc > ctx_max else "")
            + ("" if cap.fits else f" — {b('the requested batch does not fit')}")
        )
    if r.decode is not None:
        d = r.decode
        lines.append(
            f"Decode step at {d.bandwidth_bytes_per_s / 1e12:g} TB/s: weights {d.ms_weights:.2f} ms + KV "
            f"{d.ms_kv:.2f} ms = {b(f'{d.ms_total:.2f} ms')} (lower bound on time per output token)"
        )
    return "\n\n".join(lines) if markdown else "\n".join(lines)
