"""Figures for "cache vs no cache": time and token-forward passes against N, and the chapter's 750× example."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.lessons.nocache import CacheComparison, chapter_example
from kvviz.lessons.waste import forward_passes

CAPTIONS = {
    "time": "Wall-clock seconds to generate the first N tokens (prefill included) on this machine: without a "
    "cache each step re-runs the whole sequence, so the gap widens with every token.",
    "passes": "Token-forward passes (tokens pushed through the model) to generate N tokens: L + N − 1 with the "
    "cache, N·L + N(N−1)/2 without; dots are counted, lines the formula. While N ≪ L the N·L part (grey) "
    "dominates and the curve looks straight; the N²/2 part shows once N is comparable to L, as in the "
    "chapter's 1,000 + 1,000 on the right (750×).",
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


def quadratic_share(prompt_tokens: int, new_tokens: int) -> float:
    """The share of the no-cache passes that is the N(N−1)/2 term (re-running generated tokens): tiny while
    N ≪ L, where the N·L term makes the curve look straight; a third at the chapter's L = N = 1,000."""
    total = forward_passes(prompt_tokens, new_tokens).without_cache
    return (new_tokens * (new_tokens - 1) // 2) / total if total else 0.0


def passes_vs_n(cmp: CacheComparison, chapter_n: int = 1000) -> go.Figure:
    """Left, this run: counted passes (markers) on the formula (lines), with the N·L part drawn alone so the
    N(N−1)/2 term is the gap above it. Right, the chapter's L = N = ``chapter_n``, where that term shows: 750×."""
    df = cmp.frame()
    n, length = df["N (tokens generated)"], cmp.prompt_tokens
    share = quadratic_share(length, cmp.new_tokens)
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.14,
        subplot_titles=(f"this run: L = {length:,}, N ≤ {cmp.new_tokens}", f"the chapter: L = {chapter_n:,}"),
    )
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
            row=1,
            col=1,
        )
    for col, label, color in (
        ("formula without cache (NL + N(N−1)/2)", "NL + N(N−1)/2", "#d62728"),
        ("formula with cache (L + N − 1)", "L + N − 1", "#1f77b4"),
    ):
        fig.add_scatter(
            x=n, y=df[col], mode="lines", name=label, line=dict(color=color, dash="dot"), hoverinfo="skip", row=1, col=1
        )
    fig.add_scatter(
        x=n,
        y=n * length,
        mode="lines",
        name="N·L alone",
        line=dict(color="#7f7f7f", dash="dash", width=1),
        row=1,
        col=1,
    )
    # the chapter's example: Σ_{t=L}^{L+N} t against L + N, with the same N·L line
    big = np.unique(np.linspace(0, chapter_n, 51).astype(int))
    ex = [forward_passes(chapter_n, int(k)) for k in big]
    fig.add_scatter(
        x=big, y=[f.chapter_without_cache for f in ex], mode="lines", name="chapter: Σ t (without cache)",
        line=dict(color="#d62728"), row=1, col=2,
    )  # fmt: skip
    fig.add_scatter(
        x=big, y=[f.chapter_with_cache for f in ex], mode="lines", name="chapter: L + N (with cache)",
        line=dict(color="#1f77b4"), row=1, col=2,
    )  # fmt: skip
    fig.add_scatter(
        x=big, y=big * chapter_n, mode="lines", name="chapter: N·L alone", showlegend=False,
        line=dict(color="#7f7f7f", dash="dash", width=1), row=1, col=2,
    )  # fmt: skip
    last = ex[-1]
    fig.add_annotation(
        x=chapter_n, y=last.chapter_without_cache, xref="x2", yref="y2", xanchor="right", yanchor="bottom",
        text=f"{last.chapter_without_cache:,} vs {last.chapter_with_cache:,}: {int(last.chapter_ratio)}×",
        showarrow=False, font=dict(size=11),
    )  # fmt: skip
    straight = share < 0.2
    fig.update_layout(
        title=(
            f"Passes: N·L dominates (L = {length:,} ≫ N = {cmp.new_tokens})<br><sup>the N²/2 term is "
            f"{share:.0%} of the no-cache work here: nearly a straight line</sup>"
            if straight
            else f"Passes: linear with the cache, quadratic without<br><sup>the N²/2 term is {share:.0%} of "
            "the no-cache work here</sup>"
        ),
        height=380,
        margin=dict(l=60, r=20, t=80, b=40),
        legend=dict(orientation="h", y=-0.2, font=dict(size=10)),
    )
    fig.update_xaxes(title_text="N (tokens generated)")
    fig.update_yaxes(title_text="token-forward passes", row=1, col=1)
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
