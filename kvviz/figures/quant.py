"""Figures for the Quantization view: K/V magnitude maps, error per scheme, bytes, next-token agreement."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvviz.quant.cache import GenerationComparison
from kvviz.quant.model import OUTLIER_RATIO, OUTLIER_RATIO_MEANS, SchemeResult, outlier_ratio

CAPTIONS = {
    "keys": "|key| per channel (rows) and token (columns) for one layer and KV head: a few channels are large for "
    "every token — the outliers a per-token scale must stretch to cover, crushing the small channels.",
    "values": "|value| for the same layer and head: no channel stands out across tokens, so a scale per token "
    "fits values well (each output is a weighted sum of value rows).",
    "errors": "Relative error (%) of the stored keys, values and of the attention output recomputed with them for "
    "the same queries, per scheme, over all layers of this prompt (log scale; lower is better).",
    "bytes": "Bytes of this prompt's whole cache under each scheme (payload + fp16 scales and zero points + the "
    "16-bit recent window), against the same cache in 16-bit.",
    "layers": "Attention-output error (%) per layer for the selected schemes: where in the model quantization hurts.",
    "rotated": "|key| of the same layer and head after the orthonormal Hadamard turn (QuaRot, TurboQuant): the "
    "outlier channels' energy is spread over every channel, so a per-token scale no longer stretches for one.",
    "rotation": "Key and attention-output error (%) at 4, 3 and 2 bits for KIVI's grouping (keys per channel, values per "
    "token), plain per-token groups, and per-token groups after the Hadamard turn, all groups of 32, no "
    "full-precision window (log scale; lower is better).",
    "agreement": "Top-1 agreement (%) of next-token predictions with the full-precision cache, feeding both the "
    "full cache's own continuation, and the mean KL divergence (nats) of their distributions; a 2-bit cache "
    "that is off by about half in the attention output can still agree on most next tokens (see why above).",
}
OUTPUT_VS_ANSWER = (
    "**A large output error next to a right answer.** A 2-bit cache can leave each layer's attention output off "
    "by about half and still pick the full cache's next token most of the time (the top-1 agreement under "
    "*Generate*): that error is relative to one attention output, which each layer only adds to the residual "
    "stream beside the token's own state, and a next token needs only its logit to stay on top."
)


def values_story(tok, ch, both_ch) -> str:
    """Why KIVI groups values per token, led by the measure that carries the claim: the attention output
    (what the next layer receives), with the values' own error, which can point the other way, second.

    ``tok``: 2-bit per token (K and V); ``ch``: K per channel, V per token; ``both_ch``: K and V per channel.
    """
    v_tok, v_ch = 100 * tok.value_error, 100 * both_ch.value_error
    o_tok, o_ch = 100 * ch.output_error, 100 * both_ch.output_error
    verdict = (
        "per token is better, as KIVI chooses: each output is a weighted sum of value *rows*, and a per-token "
        "scale keeps each row's error to itself"
        if o_tok <= o_ch
        else "per channel is better on this prompt: KIVI's choice is not supported here"
    )
    other = (
        f"The values' own error points the other way (per channel {v_ch:.1f} % vs per token {v_tok:.1f} %) "
        "because it counts every entry alike, while the output weighs each value row by its attention weight, "
        "which sits on a few rows — a per-token scale fits each of those rows alone."
        if v_ch < v_tok and o_tok <= o_ch
        else f"The values' own error: per token {v_tok:.1f} %, per channel {v_ch:.1f} %."
    )
    return (
        f"**Values at 2 bits, judged by the attention output** (keys per channel in both): values per token "
        f"**{o_tok:.1f} %** vs per channel **{o_ch:.1f} %** — {verdict}. {other}"
    )


MAX_COLUMNS = 512  # tokens shown in a magnitude map before max-pooling columns


def rotation_story(results: list[SchemeResult], before: float, after: float) -> str:
    """One sentence per result of the rotation comparison (``rotation_schemes`` order: KIVI, per token, rotated
    at each bit width), then one for the magnitude maps (the keys' median outlier ratio, before / after)."""
    lines = []
    for i in range(0, len(results) - 2, 3):
        kivi, token, turned = results[i : i + 3]
        bits = kivi.scheme.key.bits
        lines.append(
            f"- **{bits} bits:** the Hadamard turn takes the per-token key error from {100 * token.key_error:.1f} % to "
            f"**{100 * turned.key_error:.1f} %** (attention output {100 * token.output_error:.1f} → "
            f"{100 * turned.output_error:.1f} %); KIVI's per-channel keys lose {100 * kivi.key_error:.1f} % "
            f"(output {100 * kivi.output_error:.1f} %)."
        )
    lines.append(
        f"- **The maps:** the median {OUTLIER_RATIO} of the keys ({OUTLIER_RATIO_MEANS}, over every layer and KV "
        f"head) is **{before:.1f}×** before the turn and **{after:.1f}×** after it — the outlier is spread, not "
        "removed, which is why a scale per channel can still do better."
    )
    return "\n".join(lines)


def maps_story(k: np.ndarray, v: np.ndarray, layer: int, head: int, n_tokens: int) -> str:
    """The outlier ratios ([Lyr, Hkv], :func:`kvviz.quant.model.channel_outlier_ratio`) of the chosen head, and
    their median over every head: the numbers the map titles and the rotation story repeat."""
    lyr, hkv = k.shape
    return (
        f"**Layer {layer}, KV head {head}:** {OUTLIER_RATIO} ({OUTLIER_RATIO_MEANS}) **{k[layer, head]:.1f}×** for "
        f"keys, **{v[layer, head]:.1f}×** for values. Over all {lyr} layers × {hkv} KV heads the median "
        f"{OUTLIER_RATIO} is {float(np.median(k)):.1f}× for keys vs {float(np.median(v)):.1f}× for values "
        f"({n_tokens} tokens)."
    )


def _pool_columns(x: np.ndarray, tokens: list[str]) -> tuple[np.ndarray, list[str]]:
    """Max-pool token columns so long prompts stay a few hundred columns wide."""
    t = x.shape[1]
    if t <= MAX_COLUMNS:
        return x, [f"{i}: {tok!r}" for i, tok in enumerate(tokens)]
    f = -(-t // MAX_COLUMNS)
    pad = np.pad(x, ((0, 0), (0, f * (-(-t // f)) - t)))
    pooled = pad.reshape(x.shape[0], -1, f).max(-1)  # [D, T/f]
    return pooled, [f"{i * f}–{min((i + 1) * f, t) - 1}" for i in range(pooled.shape[1])]


def magnitude_map(mag: np.ndarray, tokens: list[str], which: str = "keys", layer: int = 0, head: int = 0) -> go.Figure:
    """Heatmap of |x| [D channels, T tokens]; channel means on hover, top channels listed in the title."""
    z, labels = _pool_columns(mag, tokens)
    mean = mag.mean(1)
    top = np.argsort(mean)[::-1][:3]
    ratio = float(outlier_ratio(mean))
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(z.shape[1])),
            y=list(range(z.shape[0])),
            colorscale="Viridis",
            colorbar=dict(title="|x|"),
            customdata=np.tile(np.array(labels, dtype=object), (z.shape[0], 1)),
            hovertemplate="channel %{y}<br>token %{customdata}<br>|x| = %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"|{which}|, layer {layer}, KV head {head}: {OUTLIER_RATIO} {ratio:.1f}× "
        f"(largest channels {', '.join(map(str, top))})",
        xaxis_title="token position" + (" (max-pooled)" if z.shape[1] < mag.shape[1] else ""),
        yaxis_title="channel",
        height=360,
        margin=dict(l=60, r=20, t=50, b=40),
    )
    return fig


def error_bars(results: list[SchemeResult]) -> go.Figure:
    """Grouped bars per scheme: K error, V error, attention-output error (%), log y."""
    names = [r.scheme.name for r in results]
    fig = go.Figure()
    for label, attr, color in (
        ("keys", "key_error", "#1f77b4"),
        ("values", "value_error", "#2ca02c"),
        ("attention output", "output_error", "#d62728"),
    ):
        vals = [100 * getattr(r, attr) for r in results]
        fig.add_bar(
            name=label,
            x=names,
            y=vals,
            marker_color=color,
            hovertemplate="%{x}<br>" + label + ": %{y:.3f} %<extra></extra>",
        )
    fig.update_layout(
        barmode="group",
        title="Reconstruction and attention-output error per scheme",
        yaxis_type="log",
        yaxis_title="relative error (%)",
        height=420,
        margin=dict(l=60, r=20, t=50, b=140),
        # beside the bars, outside the plot area: over it, the legend covered the tallest bars
        legend=dict(x=1.01, xanchor="left", y=1, yanchor="top"),
    )
    fig.update_xaxes(tickangle=-30)
    return fig


def bytes_bars(results: list[SchemeResult]) -> go.Figure:
    """Cache bytes (KiB) per scheme with the 16-bit baseline as a dashed line."""
    names = [r.scheme.name for r in results]
    kib = [r.total_bytes / 1024 for r in results]
    text = [f"{r.compression:.2f}× smaller" for r in results]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=kib,
            text=text,
            textposition="outside",
            marker_color="#ff7f0e",
            hovertemplate="%{x}<br>%{y:,.1f} KiB<extra></extra>",
        )
    )
    if results:
        fig.add_hline(
            y=results[0].baseline_bytes / 1024,
            line_dash="dash",
            annotation_text="16-bit cache",
            annotation_position="top left",
        )
    fig.update_layout(
        title="Cache size per scheme (this prompt, all layers)",
        yaxis_title="cache size (KiB)",
        height=400,
        margin=dict(l=60, r=20, t=50, b=140),
    )
    fig.update_xaxes(tickangle=-30)
    return fig


def layer_errors(results: list[SchemeResult]) -> go.Figure:
    """Attention-output error (%) per layer, one line per scheme."""
    fig = go.Figure()
    for r in results:
        fig.add_scatter(
            x=list(range(len(r.layer_output_error))),
            y=[100 * e for e in r.layer_output_error],
            mode="lines+markers",
            name=r.scheme.name,
            hovertemplate="layer %{x}<br>%{y:.2f} %<extra></extra>",
        )
    fig.update_layout(
        title="Attention-output error per layer",
        xaxis_title="layer",
        yaxis_title="relative error (%)",
        yaxis_type="log",
        height=360,
        margin=dict(l=60, r=20, t=50, b=40),
    )
    return fig


def agreement_bars(comparisons: list[GenerationComparison]) -> go.Figure:
    """Top-1 agreement (%) per scheme, KL in the hover."""
    fig = go.Figure(
        go.Bar(
            x=[c.scheme.name for c in comparisons],
            y=[100 * c.agreement for c in comparisons],
            customdata=[[c.mean_kl, c.steps] for c in comparisons],
            marker_color="#9467bd",
            text=[f"{100 * c.agreement:.0f} %" for c in comparisons],
            textposition="outside",
            hovertemplate="%{x}<br>agreement %{y:.1f} % over %{customdata[1]} steps<br>mean KL %{customdata[0]:.4f} nats"
            "<extra></extra>",
        )
    )
    fig.update_layout(
        title="Next-token agreement with the full-precision cache",
        yaxis_range=[0, 110],
        yaxis_title="top-1 agreement (%)",
        height=360,
        margin=dict(l=60, r=20, t=50, b=120),
    )
    return fig


def side_by_side_frame(comparison: GenerationComparison) -> pd.DataFrame:
    """Generated tokens of both caches, step by step (the first disagreement onward is where texts part)."""
    return pd.DataFrame(comparison.side_by_side())
