"""Figures of the debugger ("Break the cache"): the layer × step divergence map with the first divergence
marked, and the run's tokens beside the correct run's. Pure functions of a
:class:`~kvviz.capture.divergence.Report`; each has a one-sentence caption in ``CAPTIONS``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvviz.capture.divergence import OFF_SCALE, Report
from kvviz.figures.layout import per_step

CAPTIONS = {
    "map": "Each cell is one decode step (0: the prefill) in one layer, coloured by the largest difference "
    "between the cached run and its full recomputation (K, V or attention output) in units of the dtype's "
    "tolerance: grey is rounding, red left the tolerance, and the ring marks where it first did.",
    "tokens": "The tokens the cached run generated beside a fault-free run's, step by step: a cache bug is "
    "quiet — the text often stays fluent long after the first divergence.",
}
FLOOR = 1e-3  # ratios below this share one colour (exact agreement, or rounding far inside the tolerance)


def divergence_map(report: Report) -> go.Figure:
    """Heatmap of log10(|Δ| / tolerance) per step (x) and layer (y), clipped to [−3, 3]; the first divergence
    ringed, with its quantity and position."""
    ratio = np.minimum(report.ratio, OFF_SCALE).T  # [layers, steps]
    z = np.log10(np.clip(ratio, FLOOR, 1e3))
    steps, layers = report.ratio.shape[0], report.ratio.shape[1]
    text = np.vectorize(lambda r: "cache length wrong" if r >= OFF_SCALE else f"{r:.3g} × tolerance")(ratio)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(steps)),
            y=list(range(layers)),
            zmin=-3,
            zmax=3,
            colorscale=[[0, "#f2f2f2"], [0.5, "#d9d9d9"], [0.5001, "#fcbba1"], [1, "#a50f15"]],
            colorbar=dict(title="log₁₀ |Δ|/tol", tickvals=[-3, 0, 3], ticktext=["≤ 0.001", "1 (limit)", "≥ 1000"]),
            text=text,
            hovertemplate="step %{x}, layer %{y}<br>%{text}<extra></extra>",
            xgap=1,
            ygap=1,
        )
    )
    f = report.first
    if f is None:
        title = "All clear: every step and layer within tolerance"
    else:
        where = "logits" if f.layer is None else f"layer {f.layer}"
        title = f"First divergence: step {f.step}, {where}, position {f.position} ({f.quantity})"
        y = layers - 1 if f.layer is None else f.layer
        fig.add_scatter(
            x=[f.step],
            y=[y],
            mode="markers",
            marker=dict(symbol="circle-open", size=22, line=dict(width=4, color="#08519c"), color="#08519c"),
            name="first divergence",
            hoverinfo="skip",
            showlegend=False,
        )
    return per_step(fig, title, "layer", 480, xaxis=dict(dtick=1 if steps <= 20 else None))


def tokens_table(report: Report) -> pd.DataFrame:
    """Step, the cached run's token, the correct run's token, and whether they differ."""
    clean = report.clean_tokens or []
    rows = []
    for s, tok in enumerate(report.tokens):
        right = clean[s] if s < len(clean) else ""
        rows.append({"step": s, "this run": tok, "correct run": right, "same": "yes" if tok == right else "no"})
    return pd.DataFrame(rows, columns=["step", "this run", "correct run", "same"])


def look_for(report: Report) -> str:
    """The Learn tab's "Look for" line for a run: where the map's ring sits and what left the recomputation there,
    with the run's own numbers (each of them in the view's verdict)."""
    f = report.first
    if f is None:
        return (
            "No ring on the map: every step and layer stays within the tolerance, and the tokens are the correct run's."
        )
    where = "the logits" if f.layer is None else f"layer {f.layer}"
    text = f"The ring sits at step {f.step}, {where}, position {f.position}: "
    if f.quantity == "cache length":
        more = "more" if f.jump > 0 else "fewer"
        text += f"the cache holds {abs(int(f.jump))} entry {more} than the positions fed (the cell off the scale)"
    elif f.quantity == "attention output":
        text += (
            "the keys and values still agree there, the attention output does not, and every later layer inherits it"
        )
    else:
        text += f"the {f.quantity} is the first to leave the full recomputation"
    changed = report.tokens_changed_from
    return text + (
        "; the generated tokens stay the correct run's."
        if changed is None
        else f"; the tokens change from step {changed}."
    )
