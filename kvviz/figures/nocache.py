"""Figures for "cache vs no cache": time and token-forward passes against N, linear vs quadratic."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from kvviz.lessons.nocache import CacheComparison, chapter_example

CAPTIONS = {
    "time": "Wall-clock seconds to generate the first N tokens (prefill included) on this machine: without a "
    "cache each step re-runs the whole sequence, so the gap widens with every token.",
    "passes": "Token-forward passes (tokens pushed through the model) to generate N tokens: L + N − 1 with the "
    "cache (a line), NL + N(N−1)/2 without it (a parabola); dots are counted, lines are the formula.",
    "table": "Each row is one decoding step without a cache: the whole input is re-run and every earlier "
    "token's keys and values are computed again, although they cannot change in a causal model.",
}


def time_vs_n(cmp: CacheComparison) -> go.Figure:
    """Cumulative seconds vs N for both runs."""
    n = np.arange(1, cmp.new_tokens + 1)
    fig = go.Figure()
    fig.add_scatter(
        x=n,
        y=cmp.uncached.cumulative_seconds,
        mode="lines+markers",
        name="without cache",
        line=dict(color="#d62728"),
        hovertemplate="N = %{x}<br>%{y:.2f} s<extra></extra>",
    )
    fig.add_scatter(
        x=n,
        y=cmp.cached.cumulative_seconds,
        mode="lines+markers",
        name="with KV cache",
        line=dict(color="#1f77b4"),
        hovertemplate="N = %{x}<br>%{y:.2f} s<extra></extra>",
    )
    fig.update_layout(
        title=f"Time for N tokens after a {cmp.prompt_tokens}-token prompt<br><sup>"
        f"{cmp.speedup:.1f}× slower without the cache at N = {cmp.new_tokens}</sup>",
        xaxis_title="N (tokens generated)",
        yaxis_title="time (s)",
        height=360,
        margin=dict(l=60, r=20, t=70, b=40),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


def passes_vs_n(cmp: CacheComparison) -> go.Figure:
    """Counted passes (markers) on the formula curves (lines)."""
    df = cmp.frame()
    n = df["N (tokens generated)"]
    fig = go.Figure()
    for col, label, color in (
        ("passes without cache", "without cache (counted)", "#d62728"),
        ("passes with cache", "with KV cache (counted)", "#1f77b4"),
    ):
        fig.add_scatter(
            x=n,
            y=df[col],
            mode="markers",
            name=label,
            marker=dict(color=color, size=7),
            hovertemplate="N = %{x}<br>%{y:,} passes<extra></extra>",
        )
    for col, label, color in (
        ("formula without cache (NL + N(N−1)/2)", "NL + N(N−1)/2", "#d62728"),
        ("formula with cache (L + N − 1)", "L + N − 1", "#1f77b4"),
    ):
        fig.add_scatter(x=n, y=df[col], mode="lines", name=label, line=dict(color=color, dash="dot"), hoverinfo="skip")
    fig.update_layout(
        title="Token-forward passes: linear with the cache, quadratic without",
        xaxis_title="N (tokens generated)",
        yaxis_title="token-forward passes",
        height=360,
        margin=dict(l=60, r=20, t=50, b=40),
        legend=dict(orientation="h", y=1.12),
    )
    return fig


def chapter_text(prompt_tokens: int = 1000, new_tokens: int = 1000) -> str:
    """The chapter's formula with its 1,000 + 1,000 example, numbers computed by kvviz.lessons.waste."""
    ex = chapter_example(prompt_tokens, new_tokens)
    lo, hi = ex["prompt_tokens"], ex["prompt_tokens"] + ex["new_tokens"]
    return (
        f"**The chapter's formula.** Without a cache, generating N tokens after an L-token prompt costs "
        f"the sum of t for t = L … L + N ≈ NL + N²/2 token-forward passes instead of L + N. For L = {lo:,} and "
        f"N = {ex['new_tokens']:,}: {lo:,} + {lo + 1:,} + … + {hi:,} = **{ex['without_cache']:,}** (≈ 1.5 million) vs "
        f"**{ex['with_cache']:,}** — **{ex['ratio']:,.2f}×** the work (the chapter's ≈ 750×). Counting exactly "
        f"what a loop does ({ex['exact_without_cache']:,} vs {ex['exact_with_cache']:,}) gives "
        f"{ex['exact_ratio']:,.0f}× too."
    )
