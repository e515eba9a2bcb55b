"""Figures for the Eviction view's side-by-side sections: policies compared, Compose, the attention-sinks demo.

Pure functions of a :class:`~kvviz.eviction.compare.Comparison`, a :class:`~kvviz.eviction.compose.Composition`
or a :class:`~kvviz.eviction.demos.SinksResult`; each has a one-sentence caption in ``CAPTIONS``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvviz.eviction.compare import Comparison
from kvviz.eviction.compose import Composition
from kvviz.eviction.demos import SinksResult
from kvviz.units import format_bytes

CAPTIONS = {
    "comparison": "Teacher-forced along the full cache's answer: share of steps whose top-1 next token matches the "
    "full cache, and the mean KL divergence (nats) of the next-token distributions; bytes are measured "
    "from the cache tensors at the end of the policy's own answer.",
    "bytes": "Cache size at the end of each answer (MiB), measured from the stored key and value tensors.",
    "kl": "KL(full ‖ policy) of the next-token distribution at each answer step (nats; 0 = identical).",
    "compose": "The chapter's fixes measured together on this prompt: the policy alone, the quantization alone "
    "(the whole cache), and the policy's kept entries quantized; agreement and KL are teacher-forced "
    "along the full cache's answer, bytes are what a 16-bit or packed store serves.",
    "sinks": "Perplexity of the chapter token by token (rolling mean over 64 tokens, log scale): once the text "
    "outgrows the small cache, dropping the first tokens (no sinks) makes the model much worse.",
}


def comparison_table(cmp: Comparison) -> pd.DataFrame:
    """Side-by-side rows with human units (KiB/MiB) and percentages."""
    rows = []
    for r in cmp.results:
        d = r.row()
        tps = d["decode_tokens_per_s"]
        rows.append(
            {
                "policy": d["title"],
                "kept per head": d["n_kept"],
                "answer": d["answer"],
                "top-1 agreement": f"{100 * d['top1_agreement']:.0f} %",
                "mean KL (nats)": round(d["mean_kl_nats"], 4),
                "cache": format_bytes(d["cache_bytes"]),
                "full cache": format_bytes(d["full_cache_bytes"]),
                "decode tokens/s": round(tps, 1) if tps else None,
            }
        )
    return pd.DataFrame(rows)


def look_for(cmp: Comparison) -> str:
    """The Learn tab's "Look for" line for a comparison: each policy's entries, cache bytes and answer beside the full
    cache's, and how many of its steps agree: the numbers of the table (``comparison_table``) in the same units."""
    full = cmp.full
    scope = (
        "only the context compressed (the question fed after it, so it cannot vote)"
        if full.n_compressed < full.n_prompt
        else "the whole prompt compressed"
    )
    rows = [r.row() for r in cmp.results if r.policy.name != "full"]
    each = "; ".join(
        f"{d['title']} keeps {d['n_kept']} entries per KV head ({format_bytes(d['cache_bytes'])} of cache) and answers "
        f"“{d['answer'].strip()}” ({100 * d['top1_agreement']:.0f} % of its steps pick the full cache's token)"
        for d in rows
    )
    return (
        f"Same prompt, same budget, {scope}: {each}. The full cache answers “{full.text.strip()}”: which entries "
        "matter depends on what the policy scores them by, and what it evicts is gone."
    )


def bytes_figure(cmp: Comparison) -> go.Figure:
    names = [r.policy.title for r in cmp.results]
    mib = [r.run.cache_bytes / 2**20 for r in cmp.results]
    fig = go.Figure(
        go.Bar(
            x=mib,
            y=names,
            orientation="h",
            text=[format_bytes(r.run.cache_bytes) for r in cmp.results],
            textposition="outside",
            cliponaxis=False,
            marker_color="#d62728",
        )
    )
    fig.update_layout(
        title="KV cache at the end of each answer",
        xaxis_title="cache size (MiB)",
        height=260,
        margin=dict(l=200, r=60, t=50, b=40),
        yaxis_autorange="reversed",
    )
    return fig


def kl_figure(cmp: Comparison) -> go.Figure:
    fig = go.Figure()
    for r in cmp.results[1:]:
        fig.add_trace(
            go.Scatter(
                y=r.kl,
                mode="lines+markers",
                name=r.policy.title,
                hovertemplate="step %{x}<br>KL %{y:.3g} nats<extra></extra>",
            )
        )
    fig.update_layout(
        title="KL(full ‖ policy) along the full cache's answer",
        xaxis_title="answer step",
        yaxis_title="KL divergence (nats)",
        height=300,
        margin=dict(l=60, r=20, t=50, b=40),
    )
    return fig


def sinks_figure(res: SinksResult, smooth: int = 64) -> go.Figure:
    """Rolling perplexity per variant against token position (log y)."""
    fig = go.Figure()
    frame = res.frame
    for name in frame.columns[1:]:
        ppl = np.exp(frame[name].rolling(smooth, min_periods=1).mean())
        fig.add_trace(
            go.Scatter(x=frame["position"], y=ppl, mode="lines", name=f"{name} (ppl {res.perplexity[name]:.1f})")
        )
    fig.add_vline(x=res.cache_size, line_dash="dot", annotation_text="cache full: eviction starts")
    fig.update_layout(
        title=f"Sinks matter: perplexity with a {res.cache_size}-entry cache",
        xaxis_title="token position",
        yaxis_title=f"perplexity (rolling {smooth} tokens)",
        height=360,
        margin=dict(l=60, r=20, t=50, b=40),
        legend=dict(orientation="h", y=-0.25),
    )
    fig.update_yaxes(type="log")
    return fig


def composition_table(comp: Composition) -> pd.DataFrame:
    """The four caches with human units."""
    return pd.DataFrame(
        [
            {
                "cache": r.name,
                "answer": r.answer,
                "top-1 agreement": f"{100 * r.top1_agreement:.0f} %",
                "mean KL (nats)": round(r.mean_kl, 4),
                "bytes as served": format_bytes(r.served_bytes),
                "of the full cache": f"{100 * r.served_bytes / comp.full_bytes:.1f} %",
            }
            for r in comp.rows
        ]
    )
