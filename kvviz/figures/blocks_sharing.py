"""Figures for the Blocks view's prefix sharing: each prompt's block table over one pool of physical blocks.

Pure functions of a :class:`~kvviz.blocks.sharing.Sharing`; each has a one-sentence caption in ``CAPTIONS``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvviz.blocks.hashing import common_prefix
from kvviz.blocks.sharing import Sharing
from kvviz.units import format_bytes

CAPTIONS = {
    "sharing": "Each prompt's block table (rows) mapped onto physical blocks (numbers): blocks whose chained hash "
    "matches an earlier prompt's are drawn once and shared (orange), the rest are computed and "
    "stored per prompt (blue, light for the partly filled last block).",
    "sharing_table": "Per prompt: tokens, blocks, blocks found in the prefix cache (their prefill is skipped) "
    "and the bytes the pool did not have to store again.",
}


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
