"""Figures for the live cache of each architecture: a tiny model's real cache next to the formula.

Pure functions of a :class:`~kvviz.capture.architectures.LiveCache`; each view has a one-sentence caption in
``CAPTIONS``. Sizes are bytes of the fp32 tiny models (binary units where abbreviated).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvviz.capture.architectures import LiveCache
from kvviz.units import format_bytes

CAPTIONS = {
    "table": "Each layer's cache as transformers stores it after the run: the tensors' shapes ([batch, heads, "
    "tokens, dim]), the bytes they hold, and the memory calculator's bytes for the same config and tokens.",
    "chart": "Bytes per layer measured from the cache tensors next to the formula's; for MLA the third bar is "
    "what per-head keys and values of the same attention would take, the size the chapter's pitfall "
    "(forgetting MLA's special shape) would report.",
}


def cache_table(live: LiveCache) -> pd.DataFrame:
    """One row per layer: kind, tensors with shapes, tokens held, measured and formula bytes."""
    rows = []
    per_layer = zip(live.tokens_held, live.layer_bytes, live.formula_layer_bytes)
    for layer, (held, measured, formula) in enumerate(per_layer):
        parts = [t for t in live.tensors if t.layer == layer]
        rows.append(
            {
                "layer": layer,
                "kind": parts[0].layer_kind if parts else "",
                "tensors": " + ".join(f"{t.name} {list(t.shape)}" for t in parts),
                "tokens held": held,
                "measured bytes": measured,
                "formula bytes": formula,
                "equal": "✓" if measured == formula else "✗",
            }
        )
    return pd.DataFrame(rows)


def bytes_chart(live: LiveCache) -> go.Figure:
    """Grouped bars per layer: measured vs formula bytes (and per-head K/V for MLA)."""
    kinds = {t.layer: t.layer_kind for t in live.tensors}
    x = [f"layer {i} ({kinds.get(i, '')})" for i in range(len(live.layer_bytes))]
    fig = go.Figure(
        [
            go.Bar(
                x=x,
                y=list(live.layer_bytes),
                name="measured (cache tensors)",
                marker_color="#1f77b4",
                hovertemplate="%{x}: %{y:,} B measured<extra></extra>",
            ),
            go.Bar(
                x=x,
                y=list(live.formula_layer_bytes),
                name="formula (memory calculator)",
                marker_color="#ff7f0e",
                hovertemplate="%{x}: %{y:,} B by the formula<extra></extra>",
            ),
        ]
    )
    if live.attention == "MLA":
        per_layer = live.per_head_bytes_per_token // len(live.layer_bytes)
        fig.add_trace(
            go.Bar(
                x=x,
                y=[n * per_layer for n in live.tokens_held],
                name="per-head K/V (the pitfall)",
                marker_color="#adb5bd",
                hovertemplate="%{x}: %{y:,} B if cached per head<extra></extra>",
            )
        )
    fig.update_layout(
        title=f"{live.kind}: cache bytes per layer after {live.tokens_seen} tokens",
        barmode="group",
        yaxis_title="bytes (fp32)",
        height=340,
        margin=dict(l=60, r=20, t=50, b=40),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def summary_markdown(live: LiveCache) -> str:
    """What the tiny model is, what its cache holds per token, and whether the formula agrees."""
    verdict = "equal, layer by layer ✓" if live.agrees else "**different** ✗ (please report this)"
    text = (
        f"**{live.kind}** — {live.label}. A tiny random-weight `{live.model_type}` read {live.tokens_seen} "
        f"tokens in {live.elapsed_s:.2f} s (captured logits within {live.max_abs_logit_diff_vs_unpatched:.0e} "
        f"of the model's own). Cache measured from its tensors: "
        f"**{live.measured_bytes:,} B = {format_bytes(live.measured_bytes)}**; the formula: "
        f"**{live.formula_bytes:,} B** — {verdict}. Per token (every layer, no window): "
        f"**{live.bytes_per_token:,} B** measured, formula {live.formula} = {live.formula_bytes_per_token:,} B."
    )
    if live.attention == "MLA":
        ratio = live.per_head_bytes_per_token / max(live.bytes_per_token, 1)
        text += (
            f"\n\nMLA's special shape, on a real transformers cache: each layer stores one latent and one RoPE "
            f"key per token (the two tensors above; heads = 1), no factor 2 and no head count. Attention "
            f"expands them to every head's key and value on the fly; caching those instead would take "
            f"{live.per_head_bytes_per_token:,} B per token, {ratio:.0f}× more — the number the pitfall gives."
        )
    if live.learned_sink_share is not None:
        text += (
            f"\n\nThe learned sinks took {live.learned_sink_share:.0%} of the attention on average. A sink is one "
            "logit per head, not a token: nothing in the cache holds it, so the bytes are plain K/V."
        )
    return text
