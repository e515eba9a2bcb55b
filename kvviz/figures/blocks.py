"""Figures for the Blocks view's live cache: its blocks, one layer's slots, paged vs contiguous, per layer.

Pure functions of a :class:`~kvviz.blocks.table.BlockTable` and its allocations; each has a one-sentence
caption in ``CAPTIONS``. Cache sizes are in binary units (KiB, MiB). Prefix sharing and eviction ×
paging are drawn by :mod:`kvviz.figures.blocks_sharing` and :mod:`kvviz.figures.blocks_eviction`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvviz.blocks.table import Allocation, BlockTable
from kvviz.units import format_bytes

MiB = 2**20
FILL = [[0.0, "#ffffff"], [0.001, "#fdd0a2"], [0.999, "#fd8d3c"], [1.0, "#2171b5"]]  # empty, partial, full
CAPTIONS = {
    "grid": "Every layer and KV head (rows) holds the sequence in blocks (columns): blue blocks are full, the orange "
    "one is the partly filled last block whose empty slots are the only waste paging leaves, and sliding "
    "layers hold fewer blocks because they keep only their window.",
    "slots": "The chosen layer's blocks slot by slot, each token in the slot it fills (prompt blue, generated "
    "orange); grey slots are allocated but empty — scrub the step to watch a new block open every "
    "block-size tokens.",
    "alloc": "Bytes one sequence ties up: paging allocates only the blocks it fills, while a contiguous cache "
    "reserves the prompt plus max_new_tokens (or the whole context) up front; the grey part is empty.",
    "layers": "Per layer: entries the cache tensors hold, blocks, empty slots in the last block and bytes per "
    "block (all KV heads of the layer, and one head alone), measured from the real tensors.",
}


def empty_figure(title: str) -> go.Figure:
    """A blank chart with only its title (nothing to draw yet); the other Blocks figures use it too."""
    fig = go.Figure()
    fig.update_layout(title=title, height=200, xaxis_visible=False, yaxis_visible=False)
    return fig


# ---- the live cache -------------------------------------------------------------------------------
def block_grid(table: BlockTable) -> go.Figure:
    """Layers × KV heads (rows) by logical block (columns), coloured by how full each block is."""
    b = table.block_size
    width = max((p.first_position + p.tokens + b - 1) // b for p in table.layers) if table.layers else 0
    if width == 0:
        return empty_figure("The cache is empty")
    rows, text, labels = [], [], []
    for p in table.layers:
        fill = np.full(width, np.nan)
        spans: dict[int, tuple[int, int, int]] = {}  # column → (block, first position, entries)
        for j in range(p.blocks):
            col = p.first_position // b + j  # drawn under the positions it holds
            if col < width:
                n = min(b, p.tokens - j * b)
                fill[col] = n / b
                spans[col] = (j, p.first_position + j * b, n)
        for h in range(table.kv_heads):
            rows.append(fill)
            text.append(
                [
                    f"layer {p.layer}, KV head {h}: block {spans[c][0]} holds {spans[c][2]}/{b} slots (positions "
                    f"{spans[c][1]}–{spans[c][1] + spans[c][2] - 1}), "
                    f"{format_bytes(b * p.bytes_per_slot_per_head)}"
                    + (f", {b - spans[c][2]} empty" if spans[c][2] < b else "")
                    if c in spans
                    else ""
                    for c in range(width)
                ]
            )
            labels.append(f"L{p.layer} h{h}")
    fig = go.Figure(
        go.Heatmap(
            z=rows,
            text=text,
            hoverinfo="text",
            colorscale=FILL,
            zmin=0,
            zmax=1,
            xgap=1,
            ygap=1,
            showscale=False,
            y=labels,
            x=list(range(width)),
        )
    )
    most = max(table.blocks_per_layer)
    fewer = " (sliding layers fewer)" if min(table.blocks_per_layer) < most else ""
    fig.update_layout(
        title=f"{table.seen:,} tokens → {most} blocks of {b} slots per layer and KV head{fewer} · "
        f"{len(table.layers)} layers × {table.kv_heads} KV heads",
        xaxis_title="logical block",
        yaxis_autorange="reversed",
        height=min(1400, 140 + 9 * len(labels)),
        margin={"l": 70},
    )
    return fig


def block_slots(table: BlockTable, tokens: Sequence[str], n_prompt: int, layer: int) -> go.Figure:
    """One layer's blocks (rows) × slots (columns), each cell showing the token stored there."""
    if not 0 <= layer < len(table.layers):
        raise ValueError(f"layer must be between 0 and {len(table.layers) - 1}.")
    p, b = table.layers[layer], table.block_size
    if p.blocks == 0:
        return empty_figure(f"Layer {layer} holds nothing yet")
    z = np.full((p.blocks, b), 0.0)
    text = [[""] * b for _ in range(p.blocks)]
    hover = [["empty slot (allocated, unused)"] * b for _ in range(p.blocks)]
    for i in range(p.tokens):
        pos = p.first_position + i
        r, c = divmod(i, b)
        tok = tokens[pos] if pos < len(tokens) else ""
        z[r, c] = 1.0 if pos < n_prompt else 2.0
        text[r][c] = tok.strip()[:6] or "␣"
        hover[r][c] = f"slot {c} of block {r}: position {pos} {tok!r}"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            text=text,
            texttemplate="%{text}",
            hovertext=hover,
            hoverinfo="text",
            colorscale=[[0, "#eeeeee"], [0.5, "#cfe2ff"], [1, "#ffd8a8"]],
            zmin=0,
            zmax=2,
            showscale=False,
            xgap=2,
            ygap=2,
        )
    )
    fig.update_layout(
        title=f"Layer {layer}: {p.tokens} entries in {p.blocks} block{'s' if p.blocks > 1 else ''} of "
        f"{b} slots · {p.wasted_slots} empty · {format_bytes(b * p.bytes_per_slot)} per block",
        xaxis_title="slot in block",
        yaxis_title="block",
        yaxis_autorange="reversed",
        height=min(900, 160 + 28 * p.blocks),
    )
    return fig


def allocation_bars(allocs: Sequence[Allocation]) -> go.Figure:
    """Used vs empty bytes of each allocation scheme (MiB, log-free so the difference is visible)."""
    names = [a.scheme for a in allocs]
    fig = go.Figure(
        [
            go.Bar(
                y=names,
                x=[a.used_bytes / MiB for a in allocs],
                name="holds entries",
                orientation="h",
                marker_color="#2171b5",
                hovertext=[format_bytes(a.used_bytes) for a in allocs],
            ),
            go.Bar(
                y=names,
                x=[a.wasted_bytes / MiB for a in allocs],
                name="reserved, empty",
                orientation="h",
                marker_color="#bdbdbd",
                hovertext=[f"{format_bytes(a.wasted_bytes)} ({a.waste_share:.0%})" for a in allocs],
            ),
        ]
    )
    paged, *rest = allocs
    removed = max(a.wasted_bytes for a in rest) - paged.wasted_bytes if rest else 0
    fig.update_layout(
        barmode="stack",
        xaxis_title="bytes of this sequence's cache (MiB)",
        height=300,
        title=f"Paging wastes {format_bytes(paged.wasted_bytes)}; it removes up to "
        f"{format_bytes(removed)} of reserved-but-empty cache",
        legend={"orientation": "h", "yanchor": "top", "y": -0.35},
    )
    return fig


def layer_table(table: BlockTable) -> pd.DataFrame:
    b = table.block_size
    return pd.DataFrame(
        [
            {
                "layer": p.layer,
                "entries held": p.tokens,
                "blocks": p.blocks,
                "empty slots": p.wasted_slots,
                "bytes per block (all KV heads)": format_bytes(b * p.bytes_per_slot),
                "bytes per block (one KV head)": format_bytes(b * p.bytes_per_slot_per_head),
                "allocated": format_bytes(p.blocks * b * p.bytes_per_slot),
            }
            for p in table.layers
        ]
    )


# ---- prefix sharing ---------------------------------------------------------------------------------


# ---- eviction meets paging -----------------------------------------------------------------------------


def table_summary(table: BlockTable, allocs: Sequence[Allocation], what: str) -> str:
    """The live view's numbers in one paragraph: blocks, the partly filled last block, bytes per block, waste."""
    b = table.block_size
    per_head = b * table.layers[0].bytes_per_slot_per_head if table.layers else 0
    last = b - table.wasted_slots
    text = (
        f"**{what}**: **{table.seen:,} tokens** in blocks of **{b}** → **{-(-table.seen // b)} blocks** per "
        f"layer and KV head ({table.blocks:,} over {len(table.layers)} layers); the last block holds {last} of "
        f"{b} slots, so **{table.wasted_slots} slots are empty**. One block across every layer: {b} tokens × "
        f"{table.bytes_per_token:,} B = **{format_bytes(table.bytes_per_block)}** "
        f"({format_bytes(per_head)} per layer and KV head) of keys and values, measured from the cache tensors "
        "(the room's prefix cache below also keeps each block's attention rows, so its blocks weigh more)."
    )
    lines = [
        f"**{a.scheme}**: {format_bytes(a.reserved_bytes)} reserved for {format_bytes(a.used_bytes)} held "
        f"({a.waste_share:.0%} empty)"
        for a in allocs
    ]
    return text + "\n\n" + " · ".join(lines)
