"""Figures for the Generate view: cache growth, memory gauge, token stream, model card, checks."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from kvviz.capture.trace import EQUIVALENCE_TOLERANCE as TOLERANCE
from kvviz.capture.trace import ModelInfo, Trace
from kvviz.figures.layout import per_step
from kvviz.units import format_bytes, format_gb, plural

CAPTIONS = {
    "growth": "Each step appends one key and one value per layer and KV head, so the cache grows by the same "
    "number of bytes every step (MiB on the y-axis; the first point is the whole prompt's prefill).",
    "gauge": "The cache's bytes now, measured from its tensors, next to the model's weights and the GPU budget you "
    "picked: at long contexts or large batches the cache, not the weights, fills the GPU.",
    "tokens": "Prompt tokens went through the model in one parallel prefill; each generated token cost one "
    "decode step that read the whole cache.",
}


PREFILL_LABEL_ABOVE = 0.5  # the prefill's label above its point when the point is below this share of the top
GROWTH_POINTS = 256  # at most this many steps drawn: the line is straight, and a redraw never grows with the run
_SHOWN = {"\n": "↵", "\t": "⇥", " ": "␣", "\r": "␍"}


def cache_growth(trace: Trace, max_points: int = GROWTH_POINTS, upto: int | None = None) -> go.Figure:
    """Cache bytes (MiB) after every step (at most ``max_points`` of them, evenly spread, first and
    last included), with per-layer lengths and bytes on hover.

    ``upto`` (a replay) draws the steps up to that one only, on the full run's axes, so the line grows
    in place instead of the axes rescaling under it.
    """
    every = trace.steps
    steps = every if upto is None else every[: max(0, min(int(upto), len(every) - 1)) + 1]
    if len(steps) > max_points:
        keep = np.unique(np.linspace(0, len(steps) - 1, max_points).round().astype(int))
        steps = [steps[i] for i in keep]
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
        # the label where the chart is empty, starting right of the point: just above the axis under a line that
        # starts low (under the point were the step axis's numbers, left of it the size axis's), below a line
        # that starts high (a long prompt's prefill, then a short rise)
        top = max(s.cache_bytes for s in every) / 2**20  # the y axis's top (a replay's too: the full run's)
        low = y[0] < PREFILL_LABEL_ABOVE * top
        label = f"prefill: {plural(trace.n_prompt, 'token')}"
        fig.add_annotation(x=0, y=y[0], text=label, showarrow=True, ax=40, ay=-14 if low else 35, xanchor="left")
    fig.update_xaxes(rangemode="tozero")
    title = "KV cache size per step"
    if upto is not None and steps:
        fig.update_xaxes(range=[-0.5, max(1, len(every) - 1) + 0.5])
        fig.update_yaxes(range=[0, top * 1.08])
        title = f"KV cache after step {x[-1]}: {steps[-1].cache_lens[0]} tokens in layer 0"
    return per_step(fig, title, "cache size (MiB)", 320, yaxis_rangemode="tozero")


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
    for a, b in zip(idx, [*idx[1:], -1]):
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
    values: list[float] = [cache_bytes, weight_bytes]
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


def chip_text(token: str) -> str:
    """A token as one visible chip: newlines inside it shown as ↵ (the line still breaks after it) and a
    token of spaces or tabs as ␣ / ⇥, since the strip draws no chip for blank text."""
    shown = token.replace("\n", "↵")
    if not shown.strip():
        shown = "".join(_SHOWN.get(c, "␣") for c in shown) or "∅"  # ∅: a token that decodes to nothing
    return shown + "\n" if "\n" in token else shown


def token_spans(trace: Trace, upto: int | None = None) -> list[tuple[str, str | None]]:
    """(text, label) pairs for a highlighted token strip, one chip per token: prompt vs generated.

    ``upto`` (a replay) stops after the token decode step ``upto`` produced (step 0, the prefill,
    produced the first generated token).
    """
    out: list[tuple[str, str | None]] = [(chip_text(t), "prompt") for t in trace.tokens[: trace.n_prompt]]
    generated = trace.tokens[trace.n_prompt :]
    if upto is not None:
        generated = generated[: max(0, int(upto)) + 1]
    out += [(chip_text(t), "generated") for t in generated]
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
    """Markdown verdict of the cached-vs-recompute check, judged by the tolerance of the dtype the run computed
    in (:mod:`kvviz.capture.tolerance`; runs stored before it was recorded: fp32's 1e-3), with the greedy
    tokens' and the top-k ranking's agreement where the check counted them."""
    eq = trace.equivalence
    if not eq:
        return "Cached vs full recompute: not checked for this run."
    tol = eq.get("tolerance", TOLERANCE)
    dtype = eq.get("dtype", "float32")
    ok = eq["max_abs_logit_diff"] < tol
    out_diff = eq.get("max_abs_attn_output_diff")
    model_diff = eq.get("max_abs_logit_diff_vs_unpatched")
    installed = "" if eq.get("unpatched_reference", True) else " (another run kept the capture installed)"
    measured = f"max |Δ logit| = {eq['max_abs_logit_diff']:.2e}" + (
        f", max |Δ attention output| = {out_diff:.2e}" if out_diff is not None else ""
    )
    shared = eq.get("shared_prefix_tokens", 0)
    once = (
        f" (its first {shared} tokens, the same in the runs checked beside it, computed once for them all)"
        if shared
        else ""
    )
    bound = f"{dtype} rounding only; threshold {tol:.1e}" + (" for " + dtype if dtype != "float32" else "")
    tail = _ranking(eq) + _reading(eq, dtype)
    if eq.get("recomputations") == 1 and ok:
        return (
            f"**Cached decoding equals full recomputation** over {eq['positions_checked']} generated positions: "
            f"the whole sequence run again from scratch{once} by the model as loaded — no cache, no kvviz capture"
            f"{installed} — gives {measured} ({bound}). So the cache changes nothing, and neither does the "
            f"capture.{tail}"
        )
    text = (
        f"**Cached decoding {'equals' if ok else 'DIFFERS FROM'} full recomputation** over "
        f"{eq['positions_checked']} generated positions: {measured} ({bound})."
    )
    if model_diff is not None:
        same = model_diff < tol
        text += (
            f" Against the model without kvviz's capture: max |Δ logit| = {model_diff:.2e} — the capture "
            f"{'changes nothing' if same else '**CHANGED THE OUTPUT**'}{installed}."
        )
    return text + tail


def _ranking(eq: dict) -> str:
    """Whether the two computations pick the same tokens: the greedy one and the top-k in order."""
    if "top1_agree" not in eq:
        return ""
    n, k = eq["positions_checked"], eq["top_k"]
    ties = eq.get("near_ties", 0)
    tie = (
        f" ({plural(ties, 'position')} where two candidates are closer than the threshold, which rounding may swap)"
        if ties
        else ""
    )
    return (
        f" The greedy token agrees at {eq['top1_agree']} of {n} positions and the top-{k} ranking at "
        f"{eq['topk_agree']} of {n}{tie}."
    )


def _reading(eq: dict, dtype: str) -> str:
    """For a run in a 16-bit dtype: how a student should read a logit difference of half a unit."""
    if dtype == "float32" or "logit_scale" not in eq:
        return ""
    scale = eq["logit_scale"]
    step = _EPS.get(dtype, 0.0) * 2.0 ** np.floor(np.log2(max(scale, 1.0)))  # the spacing of numbers near scale
    return (
        f" In {dtype} a logit near {scale:.0f} is stored in steps of {step:g}, so a difference of 0.5 is a few "
        "rounding steps of the same model, not a different one: the check that matters is that the same tokens "
        "win, in the same order."
    )


_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10}  # machine epsilon: a number z is stored in steps of eps·2^⌊log2 z⌋
