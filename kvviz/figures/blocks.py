"""Figures for the Blocks view: the live cache in blocks, paged vs contiguous, prefix sharing, eviction × paging.

Pure functions of a :class:`~kvviz.blocks.table.BlockTable`, a :class:`~kvviz.blocks.sharing.Sharing` or
a list of :class:`~kvviz.blocks.live.PolicyPaging`; each has a one-sentence caption in ``CAPTIONS``.
Cache sizes are in binary units (KiB, MiB).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvviz.blocks.eviction import PAGE_ALIGNED_NOTE
from kvviz.blocks.hashing import common_prefix
from kvviz.blocks.live import PolicyPaging
from kvviz.blocks.sharing import Sharing
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
    "sharing": "Each prompt's block table (rows) mapped onto physical blocks (numbers): blocks whose chained hash "
    "matches an earlier prompt's are drawn once and shared (orange), the rest are computed and "
    "stored per prompt (blue, light for the partly filled last block).",
    "sharing_table": "Per prompt: tokens, blocks, blocks found in the prefix cache (their prefill is skipped) "
    "and the bytes the pool did not have to store again.",
    "freed": "Averaged over layers and KV heads: blocks the evicted tokens would fill if they were whole aligned "
    "blocks, blocks actually freed (every slot evicted), and blocks freed in all KV heads of a layer "
    "(what frees when one block holds every head, as in vLLM).",
    "evict_table": "Per policy at the same budget: tokens evicted, blocks freed per layer and KV head and in every "
    "head, blocks needed after compaction and the bytes compaction would move.",
    "survivors": "The chosen policy's survivors per block for every layer and KV head (rows): a block frees only "
    "at 0 (white); any survivor keeps the whole block allocated.",
}


def _empty(title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, height=200, xaxis_visible=False, yaxis_visible=False)
    return fig


# ---- the live cache -------------------------------------------------------------------------------
def block_grid(table: BlockTable) -> go.Figure:
    """Layers × KV heads (rows) by logical block (columns), coloured by how full each block is."""
    b = table.block_size
    width = max((p.first_position + p.tokens + b - 1) // b for p in table.layers) if table.layers else 0
    if width == 0:
        return _empty("The cache is empty")
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
        return _empty(f"Layer {layer} holds nothing yet")
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
def sharing_figure(s: Sharing) -> go.Figure:
    """Prompts (rows) × logical blocks (columns); the number in a cell is its physical block."""
    width = max(p.n_blocks for p in s.prompts)
    z, text, hover = [], [], []
    for p in s.prompts:
        row, txt, hov = [np.nan] * width, [""] * width, [""] * width
        for j, pid in enumerate(p.block_ids):
            shared = s.ref_counts[pid] > 1
            partial = j >= p.full_blocks
            row[j] = 2.0 if shared else (0.5 if partial else 1.0)
            txt[j] = f"#{pid}"
            lo = j * s.block_size
            hi = min(lo + s.block_size, p.n_tokens) - 1
            hov[j] = (
                f"{p.name}: block {j} (tokens {lo}–{hi}) → physical #{pid}"
                + (f", shared by {s.ref_counts[pid]} prompts" if shared else "")
                + (" (found in the prefix cache)" if j < p.cached_blocks else "")
            )
        z.append(row)
        text.append(txt)
        hover.append(hov)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            text=text,
            texttemplate="%{text}",
            hovertext=hover,
            hoverinfo="text",
            zmin=0,
            zmax=2,
            showscale=False,
            xgap=2,
            ygap=2,
            y=[p.name for p in s.prompts],
            colorscale=[[0, "#c6dbef"], [0.25, "#c6dbef"], [0.5, "#6baed6"], [0.75, "#6baed6"], [1, "#fd8d3c"]],
        )
    )
    fig.update_layout(
        title=f"{s.logical_blocks} logical blocks on {s.physical_blocks} physical blocks · "
        f"{s.shared_blocks} full block(s) of common prefix · saved "
        f"{format_bytes(s.bytes_saved)}",
        xaxis_title="logical block",
        yaxis_autorange="reversed",
        height=160 + 50 * len(s.prompts),
    )
    return fig


def sharing_table(s: Sharing) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "prompt": p.name,
                "tokens": p.n_tokens,
                "blocks": p.n_blocks,
                "found in prefix cache": p.cached_blocks,
                "computed": p.new_blocks,
                "empty slots": p.table.wasted_slots,
                "prefill tokens skipped": p.cached_blocks * s.block_size,
                "bytes not stored again": format_bytes(p.cached_blocks * s.bytes_per_block),
            }
            for p in s.prompts
        ]
    )


# ---- eviction meets paging -----------------------------------------------------------------------------
def freed_bars(runs: Sequence[PolicyPaging]) -> go.Figure:
    """Per policy: page-aligned blocks the evicted tokens amount to, blocks freed, blocks freed in every head."""
    if not runs:
        return _empty("No policy run")
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
        f"({format_bytes(per_head)} per layer and KV head), measured from the cache tensors."
    )
    lines = [
        f"**{a.scheme}**: {format_bytes(a.reserved_bytes)} reserved for {format_bytes(a.used_bytes)} held "
        f"({a.waste_share:.0%} empty)"
        for a in allocs
    ]
    return text + "\n\n" + " · ".join(lines)


def sharing_summary(s: Sharing) -> str:
    """What sharing saved, in one paragraph with units."""
    common = common_prefix([p.token_ids for p in s.prompts])
    found = (
        ", ".join(f"{p.name} → {p.cached_blocks} block{'s' if p.cached_blocks != 1 else ''}" for p in s.prompts[1:])
        or "nothing (one prompt)"
    )
    return (
        f"The prompts start with the same **{common} tokens** → **{s.shared_blocks} full block"
        f"{'s' if s.shared_blocks != 1 else ''} of {s.block_size}** in common (a block is shared only when its "
        f"chained hash matches, i.e. every token up to its end is equal). Found in the prefix cache: {found}. "
        f"That is **{s.prefill_tokens_saved:,} prefill tokens** not recomputed ({s.prefill_tokens_saved:,} of "
        f"{s.prefill_tokens:,}) and **{format_bytes(s.bytes_saved)}** not stored again "
        f"({format_bytes(s.bytes_per_block)} per block over every layer); {s.logical_blocks} logical blocks "
        f"on {s.physical_blocks} physical ones."
    )
