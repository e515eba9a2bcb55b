"""Figures for the paged start-up section of the Memory view (vLLM's start-up log): the log with its formulas, groups, concurrency.

Pure functions of an :class:`~kvviz.memory.paged.PagedStartup`; each has a caption in ``CAPTIONS``.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvviz.memory.paged import PagedStartup
from kvviz.units import format_bytes

MARKS = "¹²³⁴"
CAPTIONS = {
    "log": "The four numbers a paged engine (vLLM) prints when it starts, each followed by the formula that gives "
    "it with this configuration's values.",
    "groups": "The model's layers by attention kind: each kind is split into KV-cache groups of equal size that "
    "share one pool of blocks, and a request needs this many blocks in each group.",
    "concurrency": "Requests of each length that fit at once in the same blocks (dotted: your max_model_len); "
    "below the dashed line at 1 the engine cannot hold even one request of that length and refuses "
    "to start.",
}


def startup_markdown(s: PagedStartup) -> str:
    """The log as the engine prints it (numbered), then one line per number: the formula behind it."""
    log = "\n".join(f"INFO {line} {MARKS[i]}" for i, line in enumerate(s.log_lines))
    rows = "\n".join(
        f"- {MARKS[i]} **{line.split(':')[0]}** = {formula}" for i, (line, formula) in enumerate(s.formulas())
    )
    advice = f"\n\n⚠ {s.advice}" if s.advice else ""
    return (
        f"**{s.model}** on {s.gpus} GPU{'s' if s.gpus > 1 else ''} (TP {s.tp}"
        + (f", {s.pp} pipeline stages" if s.pp > 1 else "")
        + f"), KV cache in **{s.kv_dtype}**, blocks of "
        f"**{s.block_size}** tokens, max_model_len **{s.max_model_len:,}**:\n\n```\n{log}\n```\n\n{rows}{advice}"
    )


def groups_table(s: PagedStartup) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "attention": k.kind + (f" (window {k.window:,})" if k.window else ""),
                "layers": k.layers,
                "KV-cache groups": k.groups,
                "layers per group": s.layers_per_group,
                "page per layer per GPU": format_bytes(k.page_bytes),
                "blocks per request (per group)": k.blocks_per_request,
                "how": k.request_expr,
            }
            for k in s.kinds
        ]
    )


def concurrency_chart(s: PagedStartup) -> go.Figure:
    top = max(s.max_model_len, 2 * s.kv_cache_tokens, 1024)  # past the point where one request no longer fits
    lens = sorted({2**k for k in range(10, min(top, 1 << 27).bit_length() + 1)} | {s.max_model_len})
    ys = [s.concurrency_at(m) for m in lens]
    fig = go.Figure(
        go.Scatter(
            x=lens,
            y=ys,
            mode="lines+markers",
            name="maximum concurrency",
            hovertemplate="%{x:,} tokens per request: %{y:.2f}x<extra></extra>",
        )
    )
    fig.add_hline(y=1, line_dash="dash", line_color="#a50f15")
    fig.add_vline(x=s.max_model_len, line_dash="dot", line_color="#636363")
    fig.update_layout(
        title=f"{s.num_blocks:,} blocks of {s.block_size} tokens: requests that fit at once",
        xaxis_title="max_model_len (tokens, log scale)",
        yaxis_title="maximum concurrency (×, log)",
        xaxis_type="log",
        yaxis_type="log",
        height=300,
    )
    return fig
