"""Figures for the Attention view's sinks: the sink map, the sink line, key and value norms, the token strip.

Pure functions of a :class:`~kvviz.capture.trace.Trace` over :mod:`kvviz.sinks`' numbers; each has a one-sentence
caption in ``CAPTIONS``.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.capture.trace import Trace
from kvviz.figures.attention import token_label
from kvviz.sinks import (
    check_k,
    layer_sink_line,
    learned_sink_fraction,
    sink_fraction,
    span_norms,
    top_received,
)

CAPTIONS = {
    "sink_map": "Share of attention (percent, averaged over queries) that each layer's heads give the first k "
    "tokens; click a cell in the table to open that head. Uniform attention would give the "
    "dashed baseline in the line chart, so anything far above it is a sink.",
    "sink_line": "Per layer: the mean over heads (line) and the range from the least to the most sink-bound head "
    "(band) of attention on the first k tokens, against what uniform attention would give; models "
    "with learned sinks (gpt-oss) add the share each head's learned sink logit took.",
    "norms": "The first tokens collect much of the attention, yet their values are small (and so are their keys): a "
    "sink is a place to park attention that adds little to the output. Norms are L2, per KV head, averaged.",
    "tokens": "The first k tokens (sinks) are marked; 'most attended' are the other tokens that received the "
    "most attention per query, averaged over every layer and head.",
}


STRIP_MAX = 1200  # tokens shown in the token strip (the middle of a longer run is elided)


def later_layers_summary(trace: Trace, k: int = 4) -> str:
    """What the map shows for the later half of the layers, in this run's numbers: the range of the per-layer
    means of attention on the first ``k`` tokens, how many heads give them more than half, and uniform's share."""
    frac = sink_fraction(trace, k)  # [Lyr, Hq]
    first = frac.shape[0] // 2
    later = frac[first:]
    means = later.mean(1)
    uniform = float(layer_sink_line(trace, k)["uniform"].mean())
    return (
        f"layers {first}–{frac.shape[0] - 1}: {100 * means.min():.0f}–{100 * means.max():.0f} % on average per layer, "
        f"{int((later > 0.5).sum())} of {later.size} heads above 50 %; uniform attention: {100 * uniform:.1f} %"
    )


def sink_map(trace: Trace, k: int = 4) -> go.Figure:
    """Layers × query heads: percent of attention on the first ``k`` tokens; KV groups separated. With
    learned sinks (gpt-oss) a second panel beside it: percent on each head's learned sink."""
    info = trace.model
    panels = [(f"first {k} tokens", sink_fraction(trace, k) * 100)]  # [Lyr, Hq] each
    learned = learned_sink_fraction(trace, k)
    if learned is not None:
        panels.append(("learned sink", learned * 100))
    titles = [p[0] for p in panels] if learned is not None else None
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=titles, shared_yaxes=True, horizontal_spacing=0.04)
    x = [f"q{h}" for h in range(info.q_heads)]
    for col, (name, frac) in enumerate(panels, start=1):
        fig.add_trace(
            go.Heatmap(
                z=frac.astype(np.float32),
                x=x,
                y=list(range(info.layers)),
                zmin=0,
                zmax=100,
                colorscale="Magma",
                text=np.round(frac).astype(int).astype(str),
                texttemplate="%{text}",
                textfont=dict(size=9),
                colorbar=dict(title="% of attention"),
                showscale=col == 1,
                hovertemplate="layer %{y}, head %{x}<br>%{z:.1f}% of attention on the " + name + "<extra></extra>",
            ),
            row=1,
            col=col,
        )
        for kv in range(1, info.kv_heads):
            xline = kv * info.group_size - 0.5
            fig.add_shape(
                type="line",
                xref=f"x{col if col > 1 else ''}",
                yref="paper",
                x0=xline,
                x1=xline,
                y0=0,
                y1=1,
                line=dict(color="white", width=2),
            )
    title = f"Sink map: % of attention on the first {k} tokens (white lines: KV groups)"
    if learned is not None:
        title = f"Sink map: % of attention on the first {k} tokens and on each head's learned sink"
    title += f"<br><sup>{later_layers_summary(trace, k)}</sup>"
    fig.update_layout(title=title, height=max(360, 16 * info.layers + 100), margin=dict(l=50, r=20, t=80, b=40))
    fig.update_xaxes(title_text="query head")
    fig.update_yaxes(title_text="layer", autorange="reversed", dtick=2, col=1)
    return fig


def sink_line(trace: Trace, k: int = 4) -> go.Figure:
    """Per-layer sink mass: head mean, min–max band, and the uniform-attention baseline (percent)."""
    df = layer_sink_line(trace, k)
    x = df["layer"].tolist()
    fig = go.Figure(
        [
            go.Scatter(
                x=x, y=(df["max"] * 100).tolist(), mode="lines", line=dict(width=0), showlegend=False, hoverinfo="skip"
            ),
            go.Scatter(
                x=x,
                y=(df["min"] * 100).tolist(),
                mode="lines",
                line=dict(width=0),
                fill="tonexty",
                fillcolor="rgba(255,127,14,0.25)",
                name="range over heads",
                hoverinfo="skip",
            ),
            go.Scatter(
                x=x,
                y=(df["mean"] * 100).tolist(),
                mode="lines+markers",
                name="mean over heads",
                line=dict(color="#ff7f0e"),
                hovertemplate="layer %{x}: %{y:.1f}%<extra></extra>",
            ),
            go.Scatter(
                x=x,
                y=(df["uniform"] * 100).tolist(),
                mode="lines",
                name="uniform attention",
                line=dict(color="#555", dash="dash"),
                hovertemplate="uniform: %{y:.1f}%<extra></extra>",
            ),
        ]
    )
    if "learned" in df:
        fig.add_trace(
            go.Scatter(
                x=x,
                y=(df["learned"] * 100).tolist(),
                mode="lines+markers",
                name="learned sink",
                line=dict(color="#2f9e44"),
                hovertemplate="learned sink: %{y:.1f}%<extra></extra>",
            )
        )
    fig.update_layout(
        title=f"Attention on the first {k} tokens, per layer",
        xaxis_title="layer",
        yaxis=dict(title="% of attention", range=[0, 100]),
        height=360,
        margin=dict(l=50, r=20, t=50, b=40),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def norms_chart(trace: Trace, k: int = 4) -> go.Figure:
    """Per layer, keys (top) and values (bottom): the first token, the rest of the first ``k``, and
    every other cached token (mean L2 norm over KV heads)."""
    k = check_k(trace, k)
    x = list(range(trace.model.layers))
    kinds = ("key", "value")
    titles = (
        ("keys", "values")
        if trace.model.attention != "MLA"
        else ("latents (MLA caches these, not keys)", "RoPE keys (MLA's second cached vector)")
    )
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=titles)
    lines = [(f"token 0 {token_label(trace.tokens[0])}", span_norms(trace, 0, 1), dict(color="#ff7f0e", width=3))]
    if k > 1:
        lines.append((f"tokens 1–{k - 1}", span_norms(trace, 1, k), dict(color="#9467bd")))
    lines.append(
        (
            f"other tokens ({k}–{trace.n_tokens - 1})",
            span_norms(trace, k, trace.n_tokens),
            dict(color="#1f77b4", dash="dot"),
        )
    )
    for row, kind in enumerate(kinds, start=1):
        for i, (name, data, style) in enumerate(lines):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=data[kind].astype(float).tolist(),
                    name=name,
                    legendgroup=name,
                    showlegend=row == 1,
                    mode="lines+markers" if i == 0 else "lines",
                    line=style,
                    hovertemplate=f"{name}, layer %{{x}}: %{{y:.2f}}<extra></extra>",
                ),
                row=row,
                col=1,
            )
    fig.update_layout(
        title="Sink tokens have small keys and values",
        height=460,
        margin=dict(l=50, r=20, t=60, b=40),
        legend=dict(orientation="h", y=-0.12),
    )
    fig.update_yaxes(title_text="mean L2 norm", rangemode="tozero")
    fig.update_xaxes(title_text="layer", row=2, col=1)
    return fig


def token_spans(trace: Trace, k: int = 4, n_top: int = 5, max_tokens: int = STRIP_MAX) -> list[tuple[str, str | None]]:
    """(text, label) pairs for the token strip: sinks, most attended, prompt, generated.

    A run longer than ``max_tokens`` shows its start and end with the middle elided.
    """
    k = check_k(trace, k)
    ranked = [int(p) for p in top_received(trace, n_top + k)["position"]]  # most attended first
    top = set([p for p in ranked if p >= k][:n_top])

    def label(i: int) -> str:
        if i < k:
            return "sink"
        if i in top:
            return "most attended"
        return "prompt" if i < trace.n_prompt else "generated"

    n = trace.n_tokens
    if n <= max_tokens:
        keep = range(n)
        return [(trace.tokens[i], label(i)) for i in keep]
    head, tail = max_tokens * 2 // 3, max_tokens // 3
    out: list[tuple[str, str | None]] = [(trace.tokens[i], label(i)) for i in range(head)]
    out.append((f" … {n - head - tail:,} tokens … ", None))
    out += [(trace.tokens[i], label(i)) for i in range(n - tail, n)]
    return out


TOKEN_COLORS = {"sink": "#ff7f0e", "most attended": "#ffd43b", "prompt": "#cfe2ff", "generated": "#d3f9d8"}
