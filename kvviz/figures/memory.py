"""Figures for the Memory view: the formula with numbers, the MHA/GQA/MQA/MLA table and four charts.

Pure functions of a :class:`~kvviz.memory.estimate.CacheLayout` (plus context, dtype, GPUs); each has a
one-sentence caption in ``CAPTIONS`` to show beside it. Cache sizes are in binary units (GiB),
GPU memory and weights in decimal GB, times in ms.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import plotly.graph_objects as go

from kvviz.memory.capacity import decode_step, max_sequences
from kvviz.memory.estimate import Estimate, KVDtype, attention_variants, estimate, layer_groups, resolve_kv_dtype
from kvviz.memory.layout import CacheLayout, cache_layout
from kvviz.memory.report import copies_phrase, heads_phrase
from kvviz.memory.sharing import unshared
from kvviz.units import format_bytes, format_gb

GiB = 2**30
REAL_MLA = "DeepSeek-V3"  # the preset whose MLA the chapter works through
DEFAULT_CONTEXTS = [2**k for k in range(7, 18)]  # 128 … 131,072 tokens

CAPTIONS = {
    "formula": "The chapter's formula, 2 × layers × KV heads × head dim × bytes per token, with this model's "
    "numbers read from its config; windowed layers stop at their window and MLA layers store one "
    "latent plus a RoPE key instead of per-head keys and values.",
    "table": "The same layers with each attention design: MHA gives every query head its own K/V, GQA shares "
    "them in groups, MQA keeps one, and MLA caches one compressed latent per token per layer — rows the "
    "model does not use are hypothetical (a made-up MLA row sits beside DeepSeek-V3's real 68.6 KiB, and a "
    "DeepSeek-V3.2 MLA row adds the sparse-attention indexer's key), while for a model with cross-layer KV sharing "
    "the rows marked 'every layer' are the same design with each layer storing its own K/V.",
    "size": "Cache of one sequence as the context grows: full-attention layers grow linearly, sliding-window "
    "layers stop at their window, so windowed and hybrid models bend away from their dashed "
    "all-full-attention counterfactual.",
    "capacity": "How many sequences fit in the KV budget left after the weights and the reserve: capacity falls "
    "as 1/context, which is why long-context serving costs more per token.",
    "decode": "Bytes every decode step must read, as time at full memory bandwidth (a lower bound on time per "
    "output token), for the batch that fits at each context: the weights cost the same everywhere, while the "
    "KV read grows with the context until the budget caps the batch — past a few thousand tokens it "
    "outweighs the weights.",
    "gauge": "The cache's bytes against the KV budget (GPU memory minus the reserve and the weights).",
}


# ---- the formula ---------------------------------------------------------------------------------
def _num(n: int) -> str:
    return f"{n:,}"


def formula_markdown(layout: CacheLayout, est: Estimate) -> str:
    """The formula with this model's numbers substituted, group by group, with units."""
    b = est.kv_dtype.bits / 8
    groups = layer_groups(layout, est)
    header = (
        f"**{layout.name}** — {layout.attention}, {layout.num_layers} layers, {heads_phrase(layout)}; KV stored as **{est.kv_dtype.name}** ({b:g} B per element"
        + (f", plus an fp16 scale and zero point per {est.group_size} elements" if est.group_size else "")
        + ")"
    )
    table = [
        f"| layers | stores per token per layer | tokens held at {_num(est.context)} | bytes per sequence |",
        "|---|---|---|---|",
    ]
    for g in groups:
        per_layer = g.bytes_per_token // g.count
        held = _num(g.tokens_held) + (
            f" (window {_num(g.window)} − 1)" if g.window and g.tokens_held == g.window - 1 else ""
        )
        what = f"{g.per_token_expr} = {_num(per_layer)} B" if g.bytes_per_token else g.per_token_expr
        table.append(
            f"| {g.count} × {g.kind} | {what} | {held if g.bytes_per_token else '— (fixed size)'} | "
            f"{_num(g.bytes)} B = {format_bytes(g.bytes)} |"
        )
    if set(layout.kinds) == {"full"} and not est.group_size:
        per_token = (
            f"2 × {layout.num_layers} layers × {layout.num_key_value_heads} KV heads × {layout.head_dim} "
            f"× {b:g} B = **{_num(est.bytes_per_token)} B = {format_bytes(est.bytes_per_token)}**"
        )
    else:
        per_token = (
            f"{_num(est.bytes_per_token)} B = **{format_bytes(est.bytes_per_token)}** "
            "(a token that every layer still holds)"
        )
    rep = (
        f" × {est.replication:g} ({copies_phrase(layout, est, f'KV heads replicated over TP = {est.tp}')})"
        if est.replication != 1
        else ""
    )
    paragraphs = [
        header,
        "\n".join(table),
        f"**Per token**: {per_token}",
        f"**Per sequence** at {_num(est.context)} tokens: **{_num(est.bytes_per_sequence)} B = "
        f"{format_bytes(est.bytes_per_sequence)}**",
        f"**Total** for {_num(est.batch)} sequence{'s' if est.batch > 1 else ''}{rep}: "
        f"**{_num(est.total_bytes)} B = {format_bytes(est.total_bytes)}**"
        + (f", {format_bytes(est.per_gpu_bytes)} per GPU" if est.tp > 1 else ""),
    ]
    if layout.notes:
        paragraphs.append("Read from the config: " + "; ".join(layout.notes) + ".")
    return "\n\n".join(paragraphs)


# ---- the chapter's table ---------------------------------------------------------------------------
def comparison_table(layout: CacheLayout, context: int = 131_072, kv_dtype: str | KVDtype = "bf16") -> pd.DataFrame:
    """MHA / GQA / MQA / MLA over this model's layers: per token and per sequence at ``context``.

    With cross-layer KV sharing the designs come twice: as the model shares (only its producing layers
    store K/V) and with every layer storing its own, the comparison rasbt's LLMs-from-scratch ch04/10
    prints (MHA 37.58 GB vs GQA + sharing 2.01 GB for its Gemma 4 E2B-like shape at 131,072 tokens).
    """
    kv_dtype = resolve_kv_dtype(kv_dtype)  # with its scale/zero group, so every row counts the scales too
    rows = [(v, "") for v in attention_variants(layout, context, kv_dtype)]
    if any(spec.kind == "shared" for spec in layout.layers):
        producing = sum(1 for spec in layout.layers if spec.vectors)
        rows = [(v, f" + KV sharing ({producing} of {layout.num_layers} layers store)") for v, _ in rows]
        rows += [
            (v, ", every layer")
            for v in attention_variants(unshared(layout), context, kv_dtype)
            if v.attention != "MLA"
        ]
    actual = next((v for v, _ in rows if v.actual), rows[0][0])
    return pd.DataFrame(
        [
            {
                "Attention": v.attention
                + how
                + (" (this model)" if v.actual and not how.startswith(",") else _hypothetical(layout, v)),
                "KV heads": "1 latent" if v.attention == "MLA" else v.kv_heads,
                "KV per token": format_bytes(v.bytes_per_token),
                f"{context:,}-token sequence": format_bytes(v.bytes_per_sequence),
                "decimal GB": format_gb(v.bytes_per_sequence),
                "vs this model": f"{v.bytes_per_sequence / actual.bytes_per_sequence:.3g}×",
                "per-token arithmetic": v.detail + _real_mla(layout, v, kv_dtype),
                "bytes_per_token": v.bytes_per_token,
                "bytes_per_sequence": v.bytes_per_sequence,
            }
            for v, how in rows
        ]
    )


def _hypothetical(layout: CacheLayout, v) -> str:
    layers = sum(1 for layer in layout.layers if layer.vectors)
    return f" (hypothetical: a latent on these {layers} layers)" if v.attention == "MLA" else " (hypothetical)"


def _real_mla(layout: CacheLayout, v, kv_dtype: KVDtype) -> str:
    """Beside a made-up MLA row, the real one (DeepSeek-V3's 68.6 KiB), so the two are never confused."""
    if v.attention != "MLA" or layout.mla:
        return ""
    ds = cache_layout(REAL_MLA)
    return f"; the real MLA, {REAL_MLA} ({ds.num_layers} layers): {format_bytes(estimate(ds, 1, kv_dtype=kv_dtype).bytes_per_token)}"


# ---- charts ------------------------------------------------------------------------------------------
def _all_full(layout: CacheLayout) -> CacheLayout:
    return replace(layout, layers=tuple(replace(spec, window=None) for spec in layout.layers))


def size_vs_context(
    layouts: list[CacheLayout], contexts: list[int] | None = None, kv_dtype: str | KVDtype = "bf16"
) -> go.Figure:
    """One sequence's cache (GiB) vs context for each model; dashed: the same model with no windows."""
    contexts = contexts or DEFAULT_CONTEXTS
    kv_dtype = resolve_kv_dtype(kv_dtype)
    fig = go.Figure()
    for layout in layouts:
        y = [estimate(layout, t, kv_dtype=kv_dtype).bytes_per_sequence / GiB for t in contexts]
        kinds = "/".join(sorted(set(layout.kinds)))
        fig.add_trace(
            go.Scatter(
                x=contexts,
                y=y,
                mode="lines+markers",
                name=f"{layout.name} ({kinds})",
                hovertemplate="%{x:,} tokens: %{y:.3g} GiB<extra>" + layout.name + "</extra>",
            )
        )
        if layout.windows:
            full = [estimate(_all_full(layout), t, kv_dtype=kv_dtype).bytes_per_sequence / GiB for t in contexts]
            fig.add_trace(
                go.Scatter(
                    x=contexts,
                    y=full,
                    mode="lines",
                    line=dict(dash="dash", width=1),
                    name=f"{layout.name} if every layer were full attention",
                    hovertemplate="%{x:,} tokens: %{y:.3g} GiB<extra>no windows</extra>",
                )
            )
    fig.update_layout(
        title=f"KV cache of one sequence vs context ({kv_dtype.label})",
        height=420,
        xaxis_title="context (tokens, log scale)",
        yaxis_title="KV cache (GiB, log scale)",
        margin=dict(l=60, r=20, t=50, b=50),
        legend=dict(font=dict(size=10)),
    )
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def capacity_vs_context(
    layout: CacheLayout,
    kv_budget_bytes: int,
    contexts: list[int] | None = None,
    kv_dtype: str | KVDtype = "bf16",
    tp: int = 1,
    mark: int | None = None,
) -> go.Figure:
    """Most sequences that fit in the KV budget at each context (bars, log y)."""
    contexts = contexts or DEFAULT_CONTEXTS
    kv_dtype = resolve_kv_dtype(kv_dtype)
    counts = [max_sequences(layout, kv_budget_bytes, t, kv_dtype, tp) for t in contexts]
    colors = ["#d62728" if t == mark else "#1f77b4" for t in contexts]
    fig = go.Figure(
        go.Bar(
            x=[f"{t:,}" for t in contexts],
            y=[max(c, 0.5) for c in counts],
            text=counts,
            textposition="outside",
            cliponaxis=False,
            marker_color=colors,
            hovertemplate="%{x} tokens: %{text} sequences<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"{layout.name}: sequences that fit in {format_gb(kv_budget_bytes)} "
        f"({format_bytes(kv_budget_bytes)}) of KV budget, {kv_dtype.label}",
        xaxis_title="context (tokens)",
        yaxis_title="sequences (log scale)",
        height=380,
        margin=dict(l=60, r=20, t=50, b=50),
    )
    fig.update_yaxes(type="log")
    return fig


def decode_batches(
    layout: CacheLayout,
    batch: int,
    contexts: list[int],
    kv_budget_bytes: int | None,
    kv_dtype: str | KVDtype = "bf16",
    tp: int = 1,
) -> list[int]:
    """The batch each context can really run: the requested one, capped by what fits in the KV budget."""
    if kv_budget_bytes is None:
        return [batch] * len(contexts)
    return [min(batch, max_sequences(layout, kv_budget_bytes, t, kv_dtype, tp)) for t in contexts]


def decode_sentence(step, context: int, batch: int) -> str:
    """The chapter's comparison in one line: what reading the weights and reading the KV cost per step."""
    kv, w = step.ms_kv, step.ms_weights
    who = "the KV cache, not the weights, sets" if kv > w else "the weights, not the KV cache, set"
    return (
        f"At {context:,} tokens × {batch:,} sequence{'s' if batch != 1 else ''}: reading the weights takes "
        f"{w:.1f} ms, reading the KV cache {kv:.1f} ms per decode step — {who} the time per token."
    )


def decode_time_vs_context(
    layout: CacheLayout,
    weight_bytes: int,
    batch: int,
    bandwidth_tbps: float,
    gpus: int = 1,
    contexts: list[int] | None = None,
    kv_dtype: str | KVDtype = "bf16",
    tp: int = 1,
    kv_budget_bytes: int | None = None,
    mark: int | None = None,
) -> go.Figure:
    """Stacked bars labelled in ms: reading the weights and the batch's KV per decode step.

    With ``kv_budget_bytes`` each context runs the batch that fits there (``batch`` at most), never a batch
    that cannot exist; ``mark`` (the requested context) is highlighted and its numbers lead the title.
    """
    contexts = contexts or DEFAULT_CONTEXTS
    kv_dtype = resolve_kv_dtype(kv_dtype)
    batches = decode_batches(layout, batch, contexts, kv_budget_bytes, kv_dtype, tp)
    steps = [
        decode_step(weight_bytes, estimate(layout, t, b, kv_dtype, tp).total_bytes if b else 0, bandwidth_tbps, gpus)
        for t, b in zip(contexts, batches)
    ]
    x = [f"{t:,}<br>× {b:,}" for t, b in zip(contexts, batches)]
    fade = [1.0 if mark is None or t == mark else 0.45 for t in contexts]
    label = dict(textposition="inside", insidetextanchor="middle", textfont=dict(size=10))
    fig = go.Figure(
        [
            go.Bar(
                x=x,
                y=[s.ms_weights for s in steps],
                text=[f"{s.ms_weights:.1f} ms" for s in steps],
                name=f"weights ({format_gb(weight_bytes)})",
                marker=dict(color="#1f77b4", opacity=fade),
                hovertemplate="%{x} tokens: %{y:.3g} ms<extra>weights</extra>",
                **label,
            ),
            go.Bar(
                x=x,
                y=[s.ms_kv for s in steps],
                text=[f"{s.ms_kv:.1f} ms" if b else "none fit" for s, b in zip(steps, batches)],
                name=f"KV of {batch:,} sequence{'s' if batch != 1 else ''}"
                + (" (or as many as fit)" if kv_budget_bytes is not None else ""),
                marker=dict(color="#d62728", opacity=fade),
                customdata=[format_bytes(s.kv_bytes) for s in steps],
                hovertemplate="%{x} sequences: %{y:.3g} ms (%{customdata})<extra>KV cache</extra>",
                **label,
            ),
        ]
    )
    where = f"{gpus} × {bandwidth_tbps:g} TB/s"
    title = f"{layout.name}: bytes read per decode step at {where}"
    if mark in contexts:
        i = contexts.index(mark)
        title = decode_sentence(steps[i], mark, batches[i]).replace(" — ", "<br>") + f"<br><sup>{title}</sup>"
    fig.update_layout(
        barmode="stack",
        height=400,
        margin=dict(l=60, r=20, t=90, b=60),
        title=dict(text=title, font=dict(size=13)),
        xaxis_title="context (tokens) × sequences in the batch"
        + (" (as many as fit, at most the requested batch)" if kv_budget_bytes is not None else ""),
        yaxis_title="time per step at full bandwidth (ms)",
    )
    return fig


def budget_gauge(cache_bytes: int, budget_bytes: int, title: str = "KV cache vs KV budget") -> go.Figure:
    """A gauge: cache bytes as a share of the KV budget (red beyond 100%)."""
    if budget_bytes <= 0:
        raise ValueError("The KV budget must be positive.")
    pct = 100 * cache_bytes / budget_bytes
    fig = go.Figure(
        go.Indicator(
            mode="gauge+number",
            value=pct,
            number=dict(suffix=" %", valueformat=".3g"),
            title=dict(
                text=f"{title}<br><span style='font-size:0.8em'>{format_bytes(cache_bytes)} of "
                f"{format_bytes(budget_bytes)}</span>"
            ),
            gauge=dict(
                axis=dict(range=[0, max(100, pct * 1.1)]),
                bar=dict(color="#d62728" if pct > 100 else "#1f77b4"),
                threshold=dict(line=dict(color="black", width=3), value=100),
            ),
        )
    )
    fig.update_layout(height=260, margin=dict(l=30, r=30, t=70, b=20))
    return fig
