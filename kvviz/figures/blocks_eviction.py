"""Figures for the Blocks view's eviction × paging: the blocks an eviction really frees, per layer and KV head.

Pure functions of a list of :class:`~kvviz.blocks.live.PolicyPaging`; each has a one-sentence caption in
``CAPTIONS``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from kvviz.blocks.eviction import PAGE_ALIGNED_NOTE
from kvviz.blocks.live import PolicyPaging
from kvviz.figures.blocks import empty_figure
from kvviz.units import format_bytes

CAPTIONS = {
    "freed": "Averaged over layers and KV heads: blocks the evicted tokens would fill if they were whole aligned "
    "blocks, blocks actually freed (every slot evicted), and blocks freed in all KV heads of a layer "
    "(what frees when one block holds every head, as in vLLM).",
    "evict_table": "Per policy at the same budget: tokens evicted, blocks freed per layer and KV head and in every "
    "head, blocks needed after compaction and the bytes compaction would move.",
    "survivors": "The chosen policy's survivors per block for every layer and KV head (rows): a block frees only "
    "at 0 (white); any survivor keeps the whole block allocated.",
}


def freed_bars(runs: Sequence[PolicyPaging]) -> go.Figure:
    """Per policy: page-aligned blocks the evicted tokens amount to, blocks freed, blocks freed in every head."""
    if not runs:
        return empty_figure("No policy run")
    names = [r.title.split(" (")[0] for r in runs]
    series = [
        ("evicted tokens as whole blocks", [r.paging.page_aligned_blocks.mean() for r in runs], "#bdbdbd"),
        ("blocks freed (per KV head)", [r.paging.blocks_freed.mean() for r in runs], "#fd8d3c"),
        ("blocks freed in every head", [r.paging.blocks_freed_all_heads.mean() for r in runs], "#2171b5"),
    ]
    fig = go.Figure([go.Bar(x=names, y=ys, name=label, marker_color=color) for label, ys, color in series])
    p = runs[0].paging
    fig.update_layout(
        barmode="group",
        yaxis_title="blocks per layer (mean)",
        height=340,
        legend={"orientation": "h", "yanchor": "top", "y": -0.15},
        title=f"{p.n_tokens} prompt tokens = {p.blocks_before} blocks of {p.block_size}; "
        f"budget {runs[0].budget} entries per layer and KV head",
    )
    return fig


def eviction_table(runs: Sequence[PolicyPaging]) -> pd.DataFrame:
    rows = []
    for r in runs:
        p = r.paging
        rows.append(
            {
                "policy": r.title.split(" (")[0],
                "tokens evicted (per layer & head)": int(p.tokens_evicted.mean()),
                "blocks before": p.blocks_before,
                "blocks freed (mean per head)": round(float(p.blocks_freed.mean()), 2),
                "blocks freed in every head (mean per layer)": round(float(p.blocks_freed_all_heads.mean()), 2),
                "page-aligned would free": int(p.page_aligned_blocks.mean()),
                "blocks after compaction": int(p.blocks_after_compaction.mean()),
                "compaction moves": format_bytes(p.compaction_bytes_moved),
                "freed without compaction": format_bytes(p.freed_bytes),
            }
        )
    return pd.DataFrame(rows)


def survivor_grid(run: PolicyPaging) -> go.Figure:
    """Survivors per block for every layer and KV head (rows) after the policy's prefill eviction."""
    p = run.paging
    lyr, hkv, nb = p.occupancy.shape
    z = p.occupancy.reshape(lyr * hkv, nb).astype(float)
    hover = [
        [
            f"layer {i // hkv}, KV head {i % hkv}, block {j}: "
            + (f"{int(v)} of {p.block_size} slots kept" if v else "every slot evicted → freed")
            for j, v in enumerate(row)
        ]
        for i, row in enumerate(z)
    ]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            hovertext=hover,
            hoverinfo="text",
            zmin=0,
            zmax=p.block_size,
            xgap=1,
            ygap=1,
            colorscale=[[0, "#ffffff"], [0.001, "#fee6ce"], [1, "#a63603"]],
            colorbar={"title": "kept"},
            y=[f"L{i // hkv} h{i % hkv}" for i in range(lyr * hkv)],
        )
    )
    fig.update_layout(
        title=f"{run.title.split(' (')[0]}: {int(p.blocks_freed.sum()):,} of {lyr * hkv * nb:,} "
        f"(layer, head) blocks freed",
        xaxis_title="block",
        yaxis_autorange="reversed",
        height=min(1400, 140 + 9 * lyr * hkv),
        margin={"l": 70},
    )
    return fig


def eviction_note(runs: Sequence[PolicyPaging]) -> str:
    """The view's one-paragraph verdict: tokens evicted vs blocks freed, and why aligned eviction frees more."""
    if not runs:
        return ""
    parts = [
        f"**{r.title.split(' (')[0]}** evicted {int(r.paging.tokens_evicted.mean()):,} tokens per layer and "
        f"KV head ({r.paging.page_aligned_blocks.mean():.0f} blocks' worth) and freed "
        f"**{r.paging.blocks_freed.mean():.1f}** blocks"
        for r in runs
    ]
    return "; ".join(parts) + ". " + PAGE_ALIGNED_NOTE
