"""Figures for the Eviction view: what a policy kept, why, over time, and each layer's budget.

Pure functions of a :class:`~kvviz.eviction.run.PolicyRun`; each has a caption in ``CAPTIONS``. Long
sequences are binned before plotting (at most ``MAX_COLS`` columns), never shipped whole. Policies
side by side, Compose and the sinks demo are drawn by :mod:`kvviz.figures.eviction_compare`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvviz.eviction.policies import EVICTED, HEAVY, KEPT, POLICIES, ROLE_NAMES, SINK, WINDOW
from kvviz.eviction.run import PolicyRun
from kvviz.units import format_bytes

MAX_COLS = 1200


LEADERBOARD_LINK = "?tab=leaderboard"
LEADERBOARD_NOTE = (
    "SnapKV keeps this needle, yet the [Leaderboard]("
    + LEADERBOARD_LINK
    + ") scores it at a few per cent from r = 0.25: on its passkey prompts it keeps most of the needle but "
    "writes only the answer's first digits (the Leaderboard says why)."
)


def needle_scope(policies: tuple[str, ...]) -> str:
    """What the needle demo ran, said beside its rows: the tab's ticked policies may be more than it shows."""
    names = " and ".join(POLICIES[p].title for p in policies)
    return f"The needle demo runs {names} only; press **Compare** to run the policies ticked above on the same passage."


NOT_SEEN = -1
ROLE_COLORS = {
    "evicted": "#d9d9d9",
    "kept": "#74c476",
    "sink": "#6a51a3",
    "window": "#3182bd",
    "heavy hitter": "#e6550d",
    "not yet fed": "#ffffff",
}
CAPTIONS = {
    "strip": "Each prompt (and fed) token coloured by what the chosen layer's KV head holds after the chosen step: "
    "sinks, the recent/observation window, heavy hitters, other kept entries, and evicted ones.",
    "map": "For every layer (rows) and position (columns), how many of the KV heads still hold that token after "
    "the chosen step (0 = evicted everywhere; the maximum = kept by every head).",
    "timeline": "Scrub through time: rows are steps (0 = after the prefill, then one per fed token), columns are "
    "positions; a policy that evicts while decoding moves its window right and drops entries for good.",
    "scores": "The scores behind the prefill decision for the chosen layer and KV head (the policy's own units, "
    "see the axis); bars in colour were kept, grey ones evicted.",
    "budgets": "Entries each layer (rows) and KV head (columns) keeps after the prefill: one colour for uniform "
    "budgets, a pyramid for PyramidKV, a patchwork for AdaKV's per-head budgets.",
    "budget_bytes": "The same kept set in three stores: kvpress masks evicted entries (nothing freed), kvviz pads "
    "each layer to its fullest head, a store of ragged heads holds only the kept entries.",
}


def _role_name(code: int) -> str:
    return "not yet fed" if code == NOT_SEEN else ROLE_NAMES[int(code)]


def n_seen(run: PolicyRun, step: int) -> int:
    """Tokens fed through the model after ``step`` (0 = the compressed prefill)."""
    return run.n_compressed + step


def _check(run: PolicyRun, layer: int, head: int, step: int) -> None:
    lyr, hkv = run.kept.shape[:2]
    if not 0 <= layer < lyr:
        raise ValueError(f"layer must be between 0 and {lyr - 1}.")
    if not 0 <= head < hkv:
        raise ValueError(f"KV head must be between 0 and {hkv - 1}.")
    if not 0 <= step < len(run.history):
        raise ValueError(f"step must be between 0 and {len(run.history) - 1}.")


def role_row(run: PolicyRun, layer: int, head: int, step: int, width: int | None = None) -> np.ndarray:
    """Role code per position after ``step``: [width] (EVICTED if fed and not held, NOT_SEEN if not fed yet)."""
    _check(run, layer, head, step)
    width = width or len(run.tokens)
    row = np.full(width, NOT_SEEN, dtype=np.int8)
    row[: min(n_seen(run, step), width)] = EVICTED
    pos, roles = run.history[step][layer, head], run.history_roles[step][layer, head]
    here = (pos >= 0) & (pos < width)  # padding slots of a ragged cache hold no position
    row[pos[here]] = roles[here]
    return row


def token_strip(run: PolicyRun, layer: int, head: int, step: int = 0) -> list[tuple[str, str | None]]:
    """(token text, role) pairs for a highlighted strip of every token fed so far."""
    row = role_row(run, layer, head, step)
    n = n_seen(run, step)
    return [(run.tokens[i], _role_name(row[i])) for i in range(n)]


def _bins(width: int) -> int:
    return max(1, -(-width // MAX_COLS))


def kept_map(run: PolicyRun, step: int = 0) -> go.Figure:
    """Heatmap layers × positions: number of KV heads holding each position after ``step``."""
    _check(run, 0, 0, step)
    lyr, hkv = run.kept.shape[:2]
    width = n_seen(run, step)
    counts = np.zeros((lyr, width), dtype=np.float32)
    held = run.history[step]
    for li in range(lyr):
        for h in range(hkv):
            pos = held[li, h]
            counts[li, pos[(pos >= 0) & (pos < width)]] += 1
    f = _bins(width)
    nb = -(-width // f)
    z = np.pad(counts, ((0, 0), (0, nb * f - width)), constant_values=np.nan).reshape(lyr, nb, f)
    z = np.nanmean(z, axis=-1)
    x = [i * f for i in range(nb)]
    hover = (
        "layer %{y}<br>position %{x}"
        + (f"–+{f - 1}" if f > 1 else "")
        + "<br>%{z:.2f} of "
        + f"{hkv} KV heads<extra></extra>"
    )
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=list(range(lyr)),
            zmin=0,
            zmax=hkv,
            colorscale="Greens",
            colorbar=dict(title="KV heads"),
            hovertemplate=hover,
        )
    )
    fig.update_layout(
        title=f"Kept per layer after step {step} (budget: {run.n_kept} per KV head)",
        xaxis_title="position (token index)",
        yaxis_title="layer",
        height=360,
        margin=dict(l=50, r=20, t=50, b=40),
    )
    return fig


_ROLE_ORDER = [NOT_SEEN, EVICTED, KEPT, SINK, WINDOW, HEAVY]  # = codes -1 … 4 in order (timeline() relies on it)


def _discrete_scale() -> list:
    n = len(_ROLE_ORDER)
    scale = []
    for i, code in enumerate(_ROLE_ORDER):
        c = ROLE_COLORS[_role_name(code)]
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def timeline(run: PolicyRun, layer: int, head: int) -> go.Figure:
    """Heatmap steps × positions of the role each position has after every step (one layer and KV head)."""
    _check(run, layer, head, 0)
    width = len(run.tokens)
    rows = np.stack([role_row(run, layer, head, s, width) for s in range(len(run.history))])  # [S, T]
    index = rows.astype(np.int64) + 1  # role code → position in _ROLE_ORDER (codes are -1 … 4 in order)
    f = _bins(width)
    if f > 1:  # keep the most telling role per bin (the highest code)
        nb = -(-width // f)
        index = np.pad(index, ((0, 0), (0, nb * f - width)), constant_values=0).reshape(len(rows), nb, f).max(-1)
    names = np.vectorize(lambda i: _role_name(_ROLE_ORDER[i]))(index)
    n = len(_ROLE_ORDER)
    fig = go.Figure(
        go.Heatmap(
            z=index + 0.5,
            x=[i * f for i in range(index.shape[1])],
            y=list(range(len(rows))),
            zmin=0,
            zmax=n,
            colorscale=_discrete_scale(),
            showscale=False,
            customdata=names,
            hovertemplate="step %{y}<br>position %{x}<br>%{customdata}<extra></extra>",
        )
    )
    for code in _ROLE_ORDER[1:]:
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=_role_name(code),
                marker=dict(color=ROLE_COLORS[_role_name(code)], size=10, symbol="square"),
            )
        )
    fig.update_layout(
        title=f"Held over time — layer {layer}, KV head {head}",
        xaxis_title="position (token index)",
        yaxis_title="step (0 = after prefill)",
        height=340,
        margin=dict(l=50, r=20, t=50, b=40),
        yaxis_autorange="reversed",
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


def scores_figure(run: PolicyRun, layer: int, head: int, score_label: str = "score") -> go.Figure:
    """Bars of the policy's prefill scores per position (kept coloured by role, evicted grey)."""
    _check(run, layer, head, 0)
    fig = go.Figure()
    if run.prefill_scores is None:  # a message, not empty axes that look like a broken chart
        fig.add_annotation(
            text="This policy keeps entries by position, not by score: there are no scores to show.",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
        fig.update_layout(height=120, margin=dict(l=20, r=20, t=20, b=20), xaxis_visible=False, yaxis_visible=False)
        return fig
    scores = run.prefill_scores[layer, head]
    pos = run.history[0][layer, head] if run.history else run.kept[layer, head]
    row = np.full(len(scores), EVICTED, dtype=np.int8)
    here = (pos >= 0) & (pos < len(scores))
    row[pos[here]] = run.kept_roles[layer, head][here]
    colors = [ROLE_COLORS[_role_name(int(c))] for c in row]
    text = [f"{i}: {run.tokens[i]!r} — {_role_name(int(row[i]))}" for i in range(len(scores))]
    fig.add_trace(
        go.Bar(
            x=list(range(len(scores))),
            y=np.nan_to_num(scores, nan=0.0),
            marker_color=colors,
            hovertext=text,
            hovertemplate="%{hovertext}<br>score %{y:.4g}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"Scores behind the prefill decision — layer {layer}, KV head {head}",
        xaxis_title="position (token index)",
        yaxis_title=score_label,
        height=300,
        margin=dict(l=60, r=20, t=50, b=40),
        bargap=0,
    )
    return fig


def slot_table(run: PolicyRun, layer: int, head: int, step: int = 0) -> pd.DataFrame:
    """The chosen head's cache after ``step``: slot, original position, token, role, RoPE position used."""
    _check(run, layer, head, step)
    pos = run.history[step][layer, head]
    roles = run.history_roles[step][layer, head]
    slots = np.arange(len(pos))
    held = pos >= 0  # a ragged cache's padding slots are not entries
    pos, roles, slots = pos[held], roles[held], slots[held]
    rope = slots if run.position_mode != "original" else pos
    return pd.DataFrame(
        {
            "cache slot": slots,
            "original position": pos,
            "token": [run.tokens[p] for p in pos],
            "role": [_role_name(r) for r in roles],
            "RoPE position": rope,
        }
    )


def kept_sentence(run: PolicyRun) -> str:
    """How many entries the heads keep, said as the budget map draws it: one number when every layer and KV head
    keeps the same count, the mean, fewest and most when the policy's budgets differ (KVzip, AdaKV, PyramidKV)."""
    counts = run.kept_counts()  # [Lyr, Hkv]
    lo, hi = int(counts.min()), int(counts.max())
    if lo == hi:
        return f"**n_kept = {run.n_kept}** entries per layer and KV head"
    return (
        f"a budget of **n_kept = {run.n_kept}** entries per layer and KV head *on average*: its heads keep "
        f"from **{lo}** to **{hi}** (mean {counts.mean():.1f}; the budget map shows each)"
    )


def bytes_sentence(run: PolicyRun) -> str:
    """The cache's bytes at the two moments the view shows: after the answer (the status) and right after the
    prefill's compression (the table of stores), each beside the full cache at the same moment."""
    fed = run.n_prompt + max(len(run.generated_ids) - 1, 0) - run.n_compressed
    full_prefill = run.kv_bytes_per_token * run.n_compressed
    return (
        f"Cache **after the answer** ({fed} tokens fed after the compression): **{format_bytes(run.cache_bytes)}** "
        f"(measured from the tensors) vs **{format_bytes(run.full_cache_bytes)}** for the full cache then; "
        f"**right after the prefill** (the table of stores): {format_bytes(run.step_bytes[0])} vs "
        f"{format_bytes(full_prefill)}."
    )


def budget_map(run: PolicyRun) -> go.Figure:
    """Heatmap layers × KV heads: entries each keeps after the prefill (PyramidKV's and AdaKV's budgets differ)."""
    counts = run.kept_counts()  # [Lyr, Hkv]
    lyr, hkv = counts.shape
    fig = go.Figure(
        go.Heatmap(
            z=counts,
            x=[f"KV head {h}" for h in range(hkv)],
            y=list(range(lyr)),
            colorscale="Viridis",
            colorbar=dict(title="entries"),
            hovertemplate="layer %{y}, %{x}<br>%{z} entries kept<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"Entries kept per layer and KV head (mean {counts.mean():.1f}, budget {run.n_kept})",
        xaxis_title="KV head",
        yaxis_title="layer",
        height=420,
        margin=dict(l=50, r=20, t=50, b=40),
    )
    return fig


def budget_bytes(run: PolicyRun) -> pd.DataFrame:
    """What the kept set costs in three stores: kvpress's masking, kvviz's padded layers, a ragged store."""
    full = run.kv_bytes_per_token * run.n_compressed
    stored, held = run.step_bytes[0], run.held_bytes if run.held_bytes is not None else run.step_bytes[0]
    rows = [
        ("kvpress (masks evicted entries: frees nothing)", full),
        ("kvviz's evicting cache (each layer as long as its fullest head)", stored),
        ("a store holding ragged heads (AdaKV's flattened cache)", held),
    ]
    return pd.DataFrame(
        {
            "store": [r[0] for r in rows],
            "bytes right after the prefill": [format_bytes(r[1]) for r in rows],
            "freed": [f"{100 * (1 - r[1] / full):.1f} %" if full else "—" for r in rows],
        }
    )
