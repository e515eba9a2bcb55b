"""Figures for the Attention view: one head's heatmap and the step scrubber (the sink views: :mod:`kvviz.figures.sinks`).

Everything is downsampled before it becomes a figure: a heatmap never has more than ``MAX_SIDE``
rows or columns (mean-pooled query rows, summed key columns, so a row still sums to 1), and token
text travels once per axis, not once per cell.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from kvviz.capture.trace import Trace
from kvviz.sinks import (
    kv_groups,
    kv_head_of,
)

MAX_SIDE = 320  # heatmap rows/columns sent to the browser
MAX_STEP_COLS = 640  # key columns of the step chart (it has only one row per head)
LOG_FLOOR = 1e-5  # attention below this shows as the floor colour on the log scale

CAPTIONS = {
    "heatmap": "Rows are queries (prompt tokens, then each generated token), columns are keys in the cache; "
    "colour is the share of the query's attention (each row sums to 1, less what a learned sink takes "
    "in gpt-oss). Look for bright columns at the left (sinks); the blank upper triangle is the causal "
    "mask, the dashed lines mark where generation began.",
    "step": "One decode step: the new token's query reads every cached key, in every head of this layer; each row "
    "is one head's attention (sums to 1). Scrub the steps to see most heads return to the same few tokens.",
}


# ---- labels ------------------------------------------------------------------------------------
def token_label(text: str) -> str:
    """Token text safe for plotly hover (which reads < > as HTML) and visible when blank."""
    shown = text.replace("<", "‹").replace(">", "›").replace("\n", "⏎").replace("\t", "⇥")
    return f"'{shown}'"


def _span_label(trace: Trace, a: int, b: int) -> str:
    """Label for positions a … b-1: ``12 'cat'`` or ``40–59 ' the' … 'cat'``."""
    if b - a == 1:
        return f"{a} {token_label(trace.tokens[a])}"
    return f"{a}–{b - 1} {token_label(trace.tokens[a])} … {token_label(trace.tokens[b - 1])}"


def _edges(n: int, step: int, start: int = 0) -> list[tuple[int, int]]:
    return [(start + i, start + min(i + step, n)) for i in range(0, n, step)]


def _pool(x: np.ndarray, step: int, axis: int, how: str, weights: np.ndarray | None = None) -> np.ndarray:
    """Sum or (weighted) mean of consecutive groups of ``step`` entries along ``axis``."""
    if step == 1:
        return x
    n = x.shape[axis]
    starts = np.arange(0, n, step)
    if how == "sum":
        return np.add.reduceat(x, starts, axis=axis)
    w = np.ones(n) if weights is None else weights.astype(np.float64)
    shape = [1] * x.ndim
    shape[axis] = n
    total = np.add.reduceat(x * w.reshape(shape), starts, axis=axis)
    count = np.add.reduceat(w, starts).reshape([-1 if i == axis else 1 for i in range(x.ndim)])
    return total / np.maximum(count, 1e-12)


def _heads(trace: Trace, head: int, group_mean: bool) -> list[int]:
    return kv_groups(trace.model)[kv_head_of(trace.model, head)] if group_mean else [head]


def _check(trace: Trace, layer: int, head: int) -> None:
    m = trace.model
    if trace.prefill_map is None or trace.decode_rows is None:
        raise ValueError("This trace has no attention maps (the run did not finish).")
    if not 0 <= int(layer) < m.layers:
        raise ValueError(f"layer must be from 0 to {m.layers - 1}.")
    if not 0 <= int(head) < m.q_heads:
        raise ValueError(f"head must be from 0 to {m.q_heads - 1}.")


# ---- the heatmap -----------------------------------------------------------------------------
def attention_grid(trace: Trace, layer: int, head: int, group_mean: bool = False, max_side: int = MAX_SIDE) -> dict:
    """The downsampled query × key matrix of one head (or its KV group's mean) and its axes.

    Returns ``z`` [rows, cols] float32 (NaN where the causal mask hides the key), ``row_spans`` and
    ``col_spans`` (position ranges), ``n_prefill_rows`` (rows before generation) and the pooling.
    """
    _check(trace, layer, head)
    f, n_prompt, t = trace.bin_factor, trace.n_prompt, trace.n_tokens
    heads = _heads(trace, head, group_mean)
    pre = trace.recorded("prefill_map")[layer, heads].astype(np.float32).mean(0)  # [nqb, nb]
    dec = trace.recorded("decode_rows")[:, layer, heads].astype(np.float32).mean(1)  # [S, nb]
    nb = -(-t // f)
    pre, dec = pre[:, :nb], dec[:, :nb]
    # split the row budget between prompt bins and decode rows in proportion to their counts
    n_pre, n_dec = pre.shape[0], dec.shape[0]
    if n_pre + n_dec > max_side:
        pre_budget = max(1, min(n_pre, round(max_side * n_pre / (n_pre + n_dec))))
        dec_budget = max(1, max_side - pre_budget) if n_dec else 0
    else:
        pre_budget, dec_budget = n_pre, n_dec
    rp = -(-n_pre // pre_budget)
    rd = -(-n_dec // dec_budget) if n_dec else 1
    rc = -(-nb // max_side)
    q_counts = np.bincount(np.arange(n_prompt) // f, minlength=n_pre)  # queries in each prompt bin
    pre = _pool(pre, rp, 0, "mean", q_counts)
    dec = _pool(dec, rd, 0, "mean") if n_dec else dec
    z = _pool(np.concatenate([pre, dec]), rc, 1, "sum").astype(np.float32)
    row_spans = _edges(n_prompt, f * rp) + _edges(n_dec, rd, start=n_prompt)
    col_spans = _edges(t, f * rc)
    # causal mask: a key that starts after the row's last query is blank, not zero
    last_q = np.array([b - 1 for _, b in row_spans])[:, None]
    first_k = np.array([a for a, _ in col_spans])[None, :]
    z[first_k > last_q] = np.nan
    return {
        "z": z,
        "row_spans": row_spans,
        "col_spans": col_spans,
        "n_prefill_rows": pre.shape[0],
        "heads": heads,
        "positions_per_col": f * rc,
        "exact": f * rc == 1 and rp == 1 and rd == 1,
    }


def _axis_labels(trace: Trace, spans: list[tuple[int, int]]) -> list[str]:
    return [_span_label(trace, a, b) for a, b in spans]


def _sparse_ticks(labels: list[str], spans: list[tuple[int, int]], n: int = 10) -> dict:
    idx = np.unique(np.linspace(0, len(labels) - 1, min(n, len(labels))).round().astype(int))
    return dict(tickmode="array", tickvals=[labels[i] for i in idx], ticktext=[str(spans[i][0]) for i in idx])


def _log_z(z: np.ndarray) -> tuple[np.ndarray, dict]:
    lz = np.log10(np.clip(z, LOG_FLOOR, None)).astype(np.float32)  # NaN stays NaN
    exps = list(range(int(np.log10(LOG_FLOOR)), 1))
    return lz, dict(tickvals=exps, ticktext=[f"1e{e}" if e else "1" for e in exps])


def attention_heatmap(
    trace: Trace, layer: int, head: int, log: bool = False, group_mean: bool = False, max_side: int = MAX_SIDE
) -> go.Figure:
    """Queries × keys for one layer and head (or the mean of its KV group), hover shows the tokens."""
    grid = attention_grid(trace, layer, head, group_mean, max_side)
    z, rows, cols = grid["z"], grid["row_spans"], grid["col_spans"]
    ylab, xlab = _axis_labels(trace, rows), _axis_labels(trace, cols)
    colorbar = dict(title="share" if not log else "share (log)")
    if log:
        z, ticks = _log_z(z)
        colorbar.update(ticks)
    hover = "query %{y}<br>key %{x}<br>" + ("log10 share %{z:.2f}" if log else "share %{z:.4f}") + "<extra></extra>"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=xlab,
            y=ylab,
            colorscale="Viridis",
            colorbar=colorbar,
            hovertemplate=hover,
            zmin=np.log10(LOG_FLOOR) if log else 0.0,
            zmax=0.0 if log else None,
        )
    )
    kv = kv_head_of(trace.model, head)
    who = (
        f"mean of query heads {grid['heads'][0]}–{grid['heads'][-1]} (KV head {kv})"
        if group_mean
        else f"query head {head} (KV head {kv})"
    )
    res = "exact" if grid["exact"] else f"{grid['positions_per_col']} key positions per column, rows pooled"
    n_pre = grid["n_prefill_rows"]
    if n_pre < len(rows):  # generation started: mark the boundary on both axes
        key_col = next(i for i, (a, b) in enumerate(cols) if a <= trace.n_prompt < b)
        line = dict(type="line", line=dict(color="white", width=1.5, dash="dash"))
        fig.add_shape(**line, xref="paper", x0=0, x1=1, yref="y", y0=n_pre - 0.5, y1=n_pre - 0.5)
        fig.add_shape(**line, yref="paper", y0=0, y1=1, xref="x", x0=key_col - 0.5, x1=key_col - 0.5)
    fig.add_annotation(
        xref="paper",
        yref="paper",
        x=0.98,
        y=0.98,
        showarrow=False,
        xanchor="right",
        text="future keys: masked",
        font=dict(color="#555"),
    )
    fig.update_layout(
        title=f"Layer {layer}, {who} · {res}",
        height=560,
        margin=dict(l=60, r=20, t=50, b=50),
        plot_bgcolor="#e9e9e9",
        xaxis=dict(title="key position (cached token)", type="category", **_sparse_ticks(xlab, cols)),
        yaxis=dict(title="query position", type="category", autorange="reversed", **_sparse_ticks(ylab, rows)),
    )
    return fig


# ---- the step scrubber --------------------------------------------------------------------------
def step_row(trace: Trace, layer: int, step: int) -> np.ndarray:
    """[Hq, nb] attention of the query that produced step ``step``'s token, keys binned by bin_factor.

    Step 0 is the prefill: its token came from the last prompt query, an exact window row.
    Step s ≥ 1 fed generated token s − 1 (position n_prompt + s − 1).
    """
    _check(trace, layer, 0)
    n_steps = len(trace.steps)
    if not 0 <= int(step) < n_steps:
        raise ValueError(f"step must be from 0 to {n_steps - 1}.")
    f, nb = trace.bin_factor, -(-trace.n_tokens // trace.bin_factor)
    if step == 0:
        row = trace.recorded("window_rows")[layer, :, -1, :]  # [Hq, L]
        out = np.zeros((row.shape[0], nb), dtype=np.float32)
        np.add.at(out, (slice(None), np.arange(row.shape[1]) // f), row)  # type: ignore[arg-type]  # numpy's stub omits slices
        return out
    return trace.recorded("decode_rows")[step - 1, layer].astype(np.float32)[:, :nb]


def step_chart(trace: Trace, layer: int, step: int, k: int | None = None, max_cols: int = MAX_STEP_COLS) -> go.Figure:
    """All heads of one layer at one step: what the new query reads in the cache."""
    row = step_row(trace, layer, step)
    q_pos = trace.n_prompt - 1 + int(step)  # the query's position
    n_keys = q_pos + 1
    f = trace.bin_factor
    visible = -(-n_keys // f)  # key bins the query can see
    rc = -(-visible // max_cols)
    z = _pool(row[:, :visible], rc, 1, "sum").astype(np.float32)
    cols = _edges(n_keys, f * rc)
    xlab = _axis_labels(trace, cols)
    info = trace.model
    ylab = [f"q{h} (kv{kv_head_of(info, h)})" for h in range(info.q_heads)]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=xlab,
            y=ylab,
            colorscale="Viridis",
            zmin=0,
            colorbar=dict(title="share"),
            hovertemplate="%{y}<br>key %{x}<br>share %{z:.4f}<extra></extra>",
        )
    )
    made = trace.steps[int(step)].token
    fig.update_layout(
        title=(
            f"Layer {layer}, step {step}: query {token_label(trace.tokens[q_pos])!s} at position {q_pos} reads "
            f"{n_keys:,} cached keys → wrote {token_label(made)}"
        ),
        height=140 + 26 * info.q_heads,
        margin=dict(l=80, r=20, t=50, b=50),
        xaxis=dict(title="key position", type="category", **_sparse_ticks(xlab, cols)),
        yaxis=dict(autorange="reversed"),
    )
    if k:
        k_col = min(-(-int(k) // (f * rc)), len(cols)) - 0.5
        fig.add_shape(
            type="rect", xref="x", yref="paper", x0=-0.5, x1=k_col, y0=0, y1=1, line=dict(color="#ff7f0e", width=2)
        )
    return fig


# ---- sinks ---------------------------------------------------------------------------------------
