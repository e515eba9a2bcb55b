"""Figures for the Blocks view's live section: the engine's real prefix cache as the room uses it.

Pure functions of a :class:`~kvviz.engine.prefix.StoreView` (a copy taken under the store's lock) and the
text of each block's tokens, in the view's order; each figure has a one-sentence caption in ``CAPTIONS``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from kvviz.engine.prefix import StoreView
from kvviz.units import format_bytes, plural

IN_USE, CACHED, ROOT_COLOUR = "#fd8d3c", "#6baed6", "#f0f0f0"
ROOT, GONE = "root", "evicted"  # ids of the tree's root and of the node standing for evicted parents
CAPTIONS = {
    "tree": "Cached blocks as a prefix tree, read left to right: a block sits after the block its chained hash "
    "follows, so the blocks every chat request starts with (template, system prompt) form the trunk and each "
    "question branches off it; orange blocks are held by running requests, blue ones wait for reuse or eviction.",
    "table": "Every cached block, the next to evict first (least recently used; blocks held by running requests "
    "cannot be evicted and come last): the block it follows, its token positions and text, the requests "
    "holding it, the requests that found it cached, and its bytes (keys and values of every layer plus the "
    "attention rows the views need). On a public deployment a block only one other session sent shows no text.",
}


def _short(block_hash: str | None) -> str:
    return "—" if block_hash is None else block_hash[:8]


def _shown(text: str, limit: int | None = None) -> str:
    """One line of a block's text: newlines as ⏎ (a chat template has several), cut to ``limit`` characters."""
    line = text.replace("\r", "").replace("\n", "⏎")
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


def _check(view: StoreView, texts: Sequence[str]) -> None:
    if len(texts) != len(view.blocks):
        raise ValueError(f"one text per block: {len(view.blocks)} blocks, {len(texts)} texts.")


def room_summary(view: StoreView) -> str:
    """Hit rate, bytes held vs capacity and evictions in one paragraph with units."""
    s = view.stats
    b, n = s.get("block_size", 16), len(view.blocks)
    in_use = sum(1 for blk in view.blocks if blk.ref_count > 0)
    cap = s.get("capacity_bytes", 0)
    share = f" ({s.get('bytes_held', 0) / cap:.0%})" if cap else ""
    hits, queried = s.get("hit_blocks", 0), s.get("queried_blocks", 0)
    text = (
        f"**{plural(n, 'block')}** of {b} tokens cached, **{format_bytes(s.get('bytes_held', 0))} of "
        f"{format_bytes(cap)}**{share} of the cache's capacity; {in_use} held by running requests. "
        f"**Hit rate {s.get('hit_rate', 0.0):.0%}**: {hits:,} of {queried:,} looked-up prompt blocks were "
        f"found cached over {plural(s.get('requests', 0), 'request')} ({hits * b:,} prompt tokens not "
        f"recomputed). **{plural(s.get('evicted_blocks', 0), 'block')} evicted** so far, least recently used "
        f"first ({format_bytes(s.get('evicted_bytes', 0))})."
    )
    if s.get("disk_capacity_bytes"):
        text += (
            f" The disk tier holds **{plural(s.get('disk_blocks', 0), 'evicted block')}**, "
            f"{format_bytes(s.get('disk_bytes', 0))} of {format_bytes(s['disk_capacity_bytes'])}; "
            f"{plural(s.get('disk_hit_blocks', 0), 'block')} came back from it on a hit, "
            f"{plural(s.get('disk_refused_files', 0), 'file')} refused as not the one written."
        )
    if s.get("session_salt"):
        text += " Each session's blocks are salted: sessions share none."
    if not n:
        text += "\n\nNo blocks yet: generate on the **Generate** tab (a prompt of at least 17 tokens) to fill it."
    return text


def room_tree(view: StoreView, texts: Sequence[str]) -> go.Figure:
    """The cached blocks as a left-to-right icicle: each block under the block it chains after."""
    _check(view, texts)
    fig = go.Figure()
    if not view.blocks:
        fig.update_layout(title="No blocks cached yet", height=200, xaxis_visible=False, yaxis_visible=False)
        return fig
    cached = {blk.block_hash for blk in view.blocks}
    ids, parents, labels, colours, hover = [ROOT], [""], ["prompt start"], [ROOT_COLOUR], ["every prompt starts here"]
    if any(blk.parent is not None and blk.parent not in cached for blk in view.blocks):
        ids.append(GONE)
        parents.append(ROOT)
        labels.append("(evicted)")
        colours.append(ROOT_COLOUR)
        hover.append("blocks whose preceding block was evicted")
    for blk, text in zip(view.blocks, texts):
        ids.append(blk.block_hash)
        parents.append(ROOT if blk.parent is None else blk.parent if blk.parent in cached else GONE)
        labels.append(_shown(text, 28) or "␣")
        colours.append(IN_USE if blk.ref_count > 0 else CACHED)
        hover.append(
            f"block {_short(blk.block_hash)}, tokens {blk.start}–{blk.start + len(blk.token_ids) - 1}<br>"
            f"{_shown(text, 80)!r}<br>held by {plural(blk.ref_count, 'running request')} · "
            f"{plural(blk.hits, 'hit')} · {format_bytes(blk.nbytes)}"
        )
    fig.add_trace(
        go.Icicle(
            ids=ids,
            parents=parents,
            labels=labels,
            hovertext=hover,
            hoverinfo="text",
            marker={"colors": colours},
            tiling={"orientation": "h"},
            root={"color": ROOT_COLOUR},
            maxdepth=-1,
        )
    )
    first = sum(1 for blk in view.blocks if blk.parent is None)
    in_use = sum(1 for blk in view.blocks if blk.ref_count > 0)
    fig.update_layout(
        title=f"{plural(len(view.blocks), 'cached block')} from {plural(first, 'first block')} · {in_use} in use",
        height=min(700, 220 + 22 * len(view.blocks)),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


def room_table(view: StoreView, texts: Sequence[str]) -> pd.DataFrame:
    """One row per cached block, the next to evict first."""
    _check(view, texts)
    rows = []
    rank = 0
    for blk, text in zip(view.blocks, texts):
        if blk.ref_count == 0:
            rank += 1
        rows.append(
            {
                "evicted": f"#{rank}" if blk.ref_count == 0 else "not while held",
                "block": _short(blk.block_hash),
                "after": _short(blk.parent),
                "tokens": f"{blk.start}–{blk.start + len(blk.token_ids) - 1}",
                "text": _shown(text),
                "held by": blk.ref_count,
                "hits": blk.hits,
                "bytes": format_bytes(blk.nbytes),
            }
        )
    return pd.DataFrame(rows, columns=["evicted", "block", "after", "tokens", "text", "held by", "hits", "bytes"])
