"""Figures for the Generate view: cache growth, memory gauge, token stream, model card, checks."""

from __future__ import annotations

import plotly.graph_objects as go

from kvviz.capture.trace import ModelInfo, Trace
from kvviz.units import format_bytes, format_gb, plural

CAPTIONS = {
    "growth": "Each step appends one key and one value per layer and KV head, so the cache grows by the same "
    "number of bytes every step (MiB on the y-axis; the first point is the whole prompt's prefill).",
    "gauge": "The cache's bytes now, measured from its tensors, next to the model's weights and the GPU budget you "
    "picked: at long contexts or large batches the cache, not the weights, fills the GPU.",
    "tokens": "Prompt tokens went through the model in one parallel prefill; each generated token cost one "
    "decode step that read the whole cache.",
}


def cache_growth(trace: Trace) -> go.Figure:
    """Cache bytes (MiB) after every step, with per-layer lengths and bytes on hover."""
    steps = trace.steps
    x = [s.index for s in steps]
    y = [s.cache_bytes / 2**20 for s in steps]
    hover = [_layer_hover(s.cache_lens, s.layer_bytes) for s in steps]
    fig = go.Figure(
        go.Scatter(
            x=x,
            y=y,
            mode="lines+markers",
            name="KV cache",
            customdata=hover,
            hovertemplate="step %{x}<br>%{y:.3f} MiB<br>%{customdata}<extra></extra>",
        )
    )
    if steps:
        fig.add_annotation(
            x=0, y=y[0], text=f"prefill: {plural(trace.n_prompt, 'token')}", showarrow=True, ax=50, ay=25
        )
    fig.update_xaxes(tickformat="d", rangemode="tozero")
    fig.update_layout(
        title="KV cache size per step",
        xaxis_title="step (0 = prefill)",
        yaxis_title="cache size (MiB)",
        height=320,
        margin=dict(l=50, r=20, t=50, b=40),
        yaxis_rangemode="tozero",
    )
    return fig


def _layer_hover(lens: list[int], sizes: list[int]) -> str:
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (n, b) in enumerate(zip(lens, sizes)):
        groups.setdefault((n, b), []).append(i)
    parts = []
    for (n, b), layers in groups.items():
        span = f"layer {layers[0]}" if len(layers) == 1 else f"{len(layers)} layers ({_ranges(layers)})"
        parts.append(f"{span}: {n} tokens, {format_bytes(b)} each")
    return "<br>".join(parts)


def _ranges(idx: list[int]) -> str:
    out, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}–{a}")
            start = b
    return ", ".join(out)


def memory_gauge(
    cache_bytes: int,
    weight_bytes: int,
    budget_bytes: float | None = None,
    budget_name: str = "GPU",
    room_tokens: int | None = None,
) -> go.Figure:
    """Horizontal bars on a log axis: cache vs weights vs the chosen GPU memory.

    ``room_tokens`` (how many cached tokens fit beside the weights) goes in the title.
    """
    names = ["KV cache (now)", "model weights"]
    values = [cache_bytes, weight_bytes]
    labels = [format_bytes(cache_bytes), format_gb(weight_bytes)]
    title = "Memory: cache vs weights"
    if budget_bytes:
        names.append(f"{budget_name} memory")
        values.append(budget_bytes)
        labels.append(format_gb(budget_bytes))
        if room_tokens is not None:
            title = f"{budget_name}: room for {room_tokens:,} cached tokens after the weights"
    fig = go.Figure(
        go.Bar(
            x=[max(v, 1) for v in values],
            y=names,
            orientation="h",
            text=labels,
            textposition="outside",
            cliponaxis=False,
            marker_color=["#d62728", "#1f77b4", "#7f7f7f"][: len(values)],
        )
    )
    fig.update_layout(title=title, xaxis_title="bytes (log scale)", height=240, margin=dict(l=120, r=60, t=50, b=40))
    ticks = [10**e for e in range(3, 13, 3)]
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=["1 kB", "1 MB", "1 GB", "1 TB"])
    return fig


def token_spans(trace: Trace) -> list[tuple[str, str | None]]:
    """(text, label) pairs for a highlighted token strip: prompt vs generated."""
    out = [(t, "prompt") for t in trace.tokens[: trace.n_prompt]]
    out += [(t, "generated") for t in trace.tokens[trace.n_prompt :]]
    return out


def model_card(info: ModelInfo) -> str:
    """Markdown: the attention shape and the chapter's formula with this model's numbers."""
    kinds = sorted(set(info.layer_kinds))
    arch = info.attention or ("MHA" if info.kv_heads == info.q_heads else ("MQA" if info.kv_heads == 1 else "GQA"))
    per_tok = info.kv_bytes_per_token
    lines = [
        f"**{info.name}** · {info.model_type} · {info.param_count / 1e6:.0f} M parameters "
        f"({format_gb(info.weight_bytes)} of weights in {info.dtype}) · on {info.device}",
        "",
        "| layers | query heads | KV heads | head dim | attention | bytes/element | context |",
        "|---|---|---|---|---|---|---|",
        f"| {info.layers} | {info.q_heads} | {info.kv_heads} | {info.head_dim} | {arch} "
        f"(groups of {info.group_size}) | {info.bytes_per_element} ({info.dtype}) | {info.context_length:,} tokens |",
        "",
        f"KV bytes per token = 2 × n_layers × n_kv × d_h × b = 2 × {info.layers} × {info.kv_heads} × "
        f"{info.head_dim} × {info.bytes_per_element} = **{per_tok:,} bytes = {format_bytes(per_tok)}**",
    ]
    if arch == "MLA":  # the cache holds one latent and one RoPE key per token and layer, not per-head K/V
        (dc, dr), b = info.stored_dims, info.bytes_per_element
        lines[-1] = (
            f"KV bytes per token = n_layers × (d_latent + d_rope) × b = {info.layers} × ({dc} + {dr}) × "
            f"{b} = **{per_tok:,} bytes = {format_bytes(per_tok)}** (MLA: no factor 2, no heads)"
        )
    if kinds != ["full_attention"]:
        lines.append(
            f"\nLayer kinds: {', '.join(kinds)}; sliding window {info.sliding_window} tokens "
            "(a sliding layer holds at most window − 1 entries between steps)."
        )
    return "\n".join(lines)


def equivalence_text(trace: Trace) -> str:
    """Markdown verdict of the cached-vs-recompute check."""
    eq = trace.equivalence
    if not eq:
        return "Cached vs full recompute: not checked for this run."
    ok = eq["max_abs_logit_diff"] < 1e-3
    out_diff = eq.get("max_abs_attn_output_diff")
    text = (
        f"**Cached decoding {'equals' if ok else 'DIFFERS FROM'} full recomputation** over "
        f"{eq['positions_checked']} generated positions: max |Δ logit| = {eq['max_abs_logit_diff']:.2e}"
        + (f", max |Δ attention output| = {out_diff:.2e}" if out_diff is not None else "")
        + " (fp rounding only; threshold 1e-3)."
    )
    model_diff = eq.get("max_abs_logit_diff_vs_unpatched")
    if model_diff is not None:
        same = model_diff < 1e-3
        text += (
            f" Against the model without kvviz's capture: max |Δ logit| = {model_diff:.2e} — the capture "
            f"{'changes nothing' if same else '**CHANGED THE OUTPUT**'}"
            + ("" if eq.get("unpatched_reference", True) else " (another run kept the capture installed)")
            + "."
        )
    return text
