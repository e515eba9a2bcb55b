"""Figures for the Blocks view's live section: the engine's real prefix cache as the room uses it.

Pure functions of a :class:`~kvviz.engine.prefix.StoreView` (a copy taken under the store's lock) and the
text of each block's tokens, in the view's order; each figure has a one-sentence caption in ``CAPTIONS``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from kvviz.engine.disk_demo import SpillDemo
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
    "disk": "The same kind of store with room in memory for one prompt's blocks: prompt A is computed, B and C "
    "push A's blocks out of memory onto the disk tier (purple: tokens read back from disk), and A again reads "
    "them back instead of computing them.",
}
ROWS_BYTES = "bytes (keys, values and attention rows)"
KV_BYTES = "of which keys and values"


def _short(block_hash: str | None) -> str:
    return "—" if block_hash is None else block_hash[:8]


def _shown(text: str, limit: int | None = None) -> str:
    """One line of a block's text: newlines as ⏎ (a chat template has several), cut to ``limit`` characters."""
    line = text.replace("\r", "").replace("\n", "⏎")
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


def _check(view: StoreView, texts: Sequence[str]) -> None:
    if len(texts) != len(view.blocks):
        raise ValueError(f"one text per block: {len(view.blocks)} blocks, {len(texts)} texts.")


def _span(sizes: Sequence[int]) -> str:
    lo, hi = min(sizes), max(sizes)
    return format_bytes(lo) if lo == hi else f"{format_bytes(lo)}–{format_bytes(hi)}"


def room_summary(view: StoreView, kv_bytes_per_token: int | None = None) -> str:
    """Hit rate, bytes held vs capacity and evictions in one paragraph with units; with ``kv_bytes_per_token``
    also what a block's bytes are (keys and values, then attention rows), so they do not read as contradicting
    the Blocks view's keys-and-values-only blocks."""
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
    if kv_bytes_per_token and view.blocks:
        sizes = [blk.nbytes for blk in view.blocks]
        kv = b * kv_bytes_per_token
        text += (
            f" A block here is {b} tokens and weighs {_span(sizes)}: its keys and values are {b} × "
            f"{kv_bytes_per_token:,} B = {format_bytes(kv)} (the same {kv_bytes_per_token:,} B per token as the "
            f"Blocks view's blocks above, whose 16 tokens hold {format_bytes(16 * kv_bytes_per_token)}), and the "
            "rest is the attention rows of its queries, kept so a request that reuses it still draws its "
            "attention views."
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


def room_table(view: StoreView, texts: Sequence[str], kv_bytes_per_token: int | None = None) -> pd.DataFrame:
    """One row per cached block, the next to evict first; with ``kv_bytes_per_token`` also its keys and values alone."""
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
                ROWS_BYTES: format_bytes(blk.nbytes),
                KV_BYTES: format_bytes(len(blk.token_ids) * (kv_bytes_per_token or 0)),
            }
        )
    columns = ["evicted", "block", "after", "tokens", "text", "held by", "hits", ROWS_BYTES]
    return pd.DataFrame(rows, columns=[*columns, KV_BYTES] if kv_bytes_per_token else columns)


def disk_demo_summary(demo: SpillDemo) -> str:
    """What the small store did, step by step, in one paragraph with the numbers of the run."""
    first, last = demo.steps[0], demo.steps[-1]
    spilled = next((s for s in demo.steps if s.disk_blocks), None)
    text = (
        f"A store of its own with **{format_bytes(demo.memory_capacity)} of memory** "
        f"({demo.memory_capacity // demo.block_bytes} blocks of {format_bytes(demo.block_bytes)}: keys and values "
        f"only) and a {format_bytes(demo.disk_capacity)} disk tier. Prompt {first.prompt} computed all "
        f"{first.sources.computed} of its tokens and left {plural(first.memory_blocks, 'block')} in memory."
    )
    if spilled is not None:
        text += (
            f" After prompt {spilled.prompt}, **{plural(spilled.disk_blocks, 'block')} "
            f"({format_bytes(spilled.disk_bytes)}) had been evicted from memory to disk**."
        )
    text += (
        f" Prompt {last.prompt} again: **{last.sources.disk} of its {last.sources.computed + last.sources.memory + last.sources.disk} "
        f"prompt tokens came back from disk**, {last.sources.memory} from memory, {last.sources.computed} computed "
        "(the last prompt token always is, with the partial block before it)."
    )
    return text


def disk_demo_look_for(demo: SpillDemo) -> str:
    """The Learn tab's "Look for" line for the disk-tier demo: the chart's last bar read back from disk, with the
    run's numbers as :func:`disk_demo_summary` gives them."""
    last = demo.steps[-1]
    total = last.sources.computed + last.sources.memory + last.sources.disk
    spilled = next((s for s in demo.steps if s.disk_blocks), None)
    pushed = (
        f"after prompt {spilled.prompt}, {plural(spilled.disk_blocks, 'block')} ({format_bytes(spilled.disk_bytes)}) "
        "had been evicted from memory to disk; "
        if spilled is not None
        else "nothing had to leave memory; "
    )
    return (
        f"A store whose memory holds {format_bytes(demo.memory_capacity)}: {pushed}prompt {last.prompt} again — the "
        f"chart's last bar — read {last.sources.disk} of its {total} prompt tokens back from disk and computed "
        f"{last.sources.computed}, instead of computing its prefill again."
    )


def disk_demo_table(demo: SpillDemo) -> pd.DataFrame:
    """One row per request of the demo: where its prompt came from and what each tier held after it."""
    return pd.DataFrame(
        [
            {
                "request": f"#{i + 1}: prompt {s.prompt}",
                "computed": s.sources.computed,
                "from memory": s.sources.memory,
                "from disk": s.sources.disk,
                "memory after": f"{plural(s.memory_blocks, 'block')}, {format_bytes(s.memory_bytes)}",
                "disk after": f"{plural(s.disk_blocks, 'block')}, {format_bytes(s.disk_bytes)}",
                "evicted to disk so far": s.evicted_blocks,
            }
            for i, s in enumerate(demo.steps)
        ]
    )
