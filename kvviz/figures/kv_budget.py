"""Figures for "Serving under a KV budget": the stored replays (:mod:`kvviz.engine.budget_store`), four ways
to spend one budget side by side.

Pure functions of the stored result (a dict) and a budget; each has a one-sentence caption in ``CAPTIONS``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from kvviz.engine.budget_store import BYTE_KINDS, replays_at, table
from kvviz.figures.blocks import empty_figure

CHAPTER = (
    "“Throughput grows almost linearly with B until a few hundred sequences. If KV memory caps B at, say, 20, you "
    "leave most of the GPU's compute unused. So shrinking the KV cache directly increases throughput.”"
)
MODE_TITLES = {
    "contiguous-context": "contiguous (model's context)",
    "contiguous": "contiguous (prompt + new tokens)",
    "paged": "paged",
    "paged+prefix": "paged + prefix sharing",
    "paged+kivi2": "paged + KIVI-2",
}
COLORS = {
    "contiguous-context": "#969696",
    "contiguous": "#fd8d3c",
    "paged": "#2171b5",
    "paged+prefix": "#238b45",
    "paged+kivi2": "#6a51a3",
}
KIND_COLORS = {"empty": "#d9d9d9", "held": "#2171b5", "shared": "#238b45", "compressed": "#6a51a3"}
CAPTIONS = {
    "running": "Sequences decoding together at each step of the replay, per way of spending the same KV budget: "
    "the flat tops are the budget, not the compute, capping the batch.",
    "throughput": "Tokens generated per second of forwards (measured) against the KV budget, per mode: more room "
    "for KV, more sequences per step, more tokens per second until the trace runs out of requests.",
    "bytes": "Where the budget went, averaged over the replay's steps: reserved but empty, held at full "
    "precision, shared prefix blocks held once, and entries stored 2-bit.",
    "table": "Per mode at this budget: the most sequences running at once, tokens per second and per step, time "
    "to first token, preemptions, and whether every answer equals its request's solo run.",
}


def _mib(n: float) -> float:
    return n / 2**20


def running_figure(replays: Sequence[dict]) -> go.Figure:
    """Per mode: sequences running at each step."""
    runs = [r for r in replays if r["fits"]]
    if not runs:
        return empty_figure("No mode holds a request at this budget")
    fig = go.Figure()
    for r in runs:
        s = r["steps"]
        fig.add_trace(
            go.Scatter(
                x=s["step"],
                y=s["running"],
                mode="lines",
                line={"shape": "hv", "color": COLORS[r["mode"]]},
                name=MODE_TITLES[r["mode"]],
            )
        )
    fig.update_layout(
        xaxis_title="step",
        yaxis_title="sequences running",
        height=400,
        title=f"KV budget {_mib(runs[0]['budget']):,.1f} MiB",
        legend={"orientation": "h", "yanchor": "top", "y": -0.2},
    )
    return fig


def throughput_figure(result: dict, case: str, budget: int | None = None) -> go.Figure:
    """Per mode: tokens per second against the stored budgets (MiB, log scale), the chosen one marked."""
    frame = table(result, case)
    frame = frame[frame["fits"]]
    if frame.empty:
        return empty_figure("No stored replay")
    if frame["budget (MiB)"].nunique() == 1:  # one budget (a live replay): a bar per mode, not a curve of one point
        return _throughput_bars(frame)
    fig = go.Figure()
    for mode, rows in frame.groupby("mode", sort=False):
        fig.add_trace(
            go.Scatter(
                x=rows["budget (MiB)"],
                y=rows["tokens/s"],
                mode="lines+markers",
                name=MODE_TITLES[str(mode)],
                line={"color": COLORS[str(mode)]},
                customdata=rows[["most running", "tokens/step"]].to_numpy(),
                hovertemplate="%{x:.1f} MiB: %{y:.1f} tokens/s, at most %{customdata[0]} running, "
                "%{customdata[1]:.2f} tokens/step<extra></extra>",
            )
        )
    if budget is not None:
        fig.add_vline(x=_mib(budget), line_dash="dot", line_color="#555")
    fig.update_layout(
        xaxis={"title": "KV budget (MiB)", "type": "log"},
        yaxis_title="tokens / s",
        height=400,
        legend={"orientation": "h", "yanchor": "top", "y": -0.2},
    )
    return fig


def _throughput_bars(frame: pd.DataFrame) -> go.Figure:
    names = [MODE_TITLES[str(m)] for m in frame["mode"]]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=frame["tokens/s"],
            marker_color=[COLORS[str(m)] for m in frame["mode"]],
            text=[f"{v:.1f}" for v in frame["tokens/s"]],
            hovertemplate="%{x}: %{y:.1f} tokens/s<extra></extra>",
        )
    )
    fig.update_layout(title=f"KV budget {frame['budget (MiB)'].iloc[0]:,.1f} MiB", yaxis_title="tokens / s", height=400)
    return fig


def bytes_figure(replays: Sequence[dict]) -> go.Figure:
    """Per mode: the mean bytes per step by kind, stacked, with the budget as a line."""
    runs = [r for r in replays if r["fits"]]
    if not runs:
        return empty_figure("No mode holds a request at this budget")
    names = [MODE_TITLES[r["mode"]] for r in runs]
    fig = go.Figure()
    for kind in BYTE_KINDS:
        means = [_mib(sum(r["steps"][f"bytes_{kind}"]) / max(1, len(r["steps"]["step"]))) for r in runs]
        fig.add_trace(go.Bar(x=names, y=means, name=kind, marker_color=KIND_COLORS[kind]))
    fig.add_hline(y=_mib(runs[0]["budget"]), line_dash="dot", line_color="#555", annotation_text="budget")
    fig.update_layout(
        barmode="stack",
        yaxis_title="MiB (mean over steps)",
        height=400,
        legend={"orientation": "h", "yanchor": "top", "y": -0.2},
    )
    return fig


def modes_table(replays: Sequence[dict]) -> pd.DataFrame:
    """One row per mode at one budget (a mode that holds no request says so)."""
    rows = []
    for r in replays:
        s = r.get("summary", {})
        if not r["fits"]:
            rows.append(
                {"mode": MODE_TITLES[r["mode"]], "most running": 0, "note": r["reason"]}
                | dict.fromkeys(
                    ("mean running", "tokens/s", "tokens/step", "TTFT p50 / p95 (steps)", "preemptions"), "–"
                )
            )
            continue
        same = s.get("all_same_as_solo")
        rows.append(
            {
                "mode": MODE_TITLES[r["mode"]],
                "most running": s["max_running"],
                "mean running": round(s["mean_running"], 1),
                "tokens/s": round(s["tokens_per_s"] or 0.0, 1),
                "tokens/step": round(s["tokens_per_step"] or 0.0, 2),
                "TTFT p50 / p95 (steps)": f"{s['ttft_steps_p50']:.0f} / {s['ttft_steps_p95']:.0f}",
                "preemptions": s["preemptions"],
                "note": "every answer = its solo run"
                if same
                else f"answers agree {s.get('agreement', 0):.0%} with the solo runs",
            }
        )
    columns = ["mode", "most running", "mean running", "tokens/s", "tokens/step", "TTFT p50 / p95 (steps)"]
    return pd.DataFrame(rows, columns=[*columns, "preemptions", "note"])


def note(result: dict, case: str, budget: int) -> str:
    """The closing sentence at one budget: sequences at once and tokens/s per mode, and paged against
    contiguous-to-context."""
    runs = replays_at(result, case, budget)
    at = _mib(runs[0]["budget"])
    by = {r["mode"]: r for r in runs}
    parts = []
    for r in runs:
        if r["fits"]:
            s = r["summary"]
            parts.append(
                f"{MODE_TITLES[r['mode']]} {s['max_running']} at once ({(s['tokens_per_s'] or 0):.1f} tokens/s)"
            )
        else:
            parts.append(f"{MODE_TITLES[r['mode']]} none (one sequence's reservation is larger than the budget)")
    text = f"At {at:,.1f} MiB of KV: " + "; ".join(parts) + "."
    ctx, paged = by.get("contiguous-context"), by.get("paged")
    if ctx and paged and ctx["fits"] and paged["fits"]:
        a, b = ctx["summary"]["max_running"], paged["summary"]["max_running"]
        text += f" Paged runs {b / a:.1f}× as many sequences at once as contiguous-to-context."
    return text
