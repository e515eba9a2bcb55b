"""Figures for "Serving under a KV budget": the stored replays (:mod:`kvviz.engine.budget_store`), four ways
to spend one budget side by side.

Pure functions of the stored result (a dict) and a budget; each has a one-sentence caption in ``CAPTIONS``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from kvviz.engine.budget_ledger import LOSSY
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
    "decode": "Every decode-only step of the stored lossless replays at the batch size both traces share (the "
    "title says which; one new token per sequence, no prompt fed): its measured time against the KV cache it read. A step reads every cached token, so a long context costs "
    "more per step where its KV is a large share of what the step reads (the calculator's 70B model at 128K); "
    "here each step also reads the whole model's weights, hundreds of MiB, and the title says what tens of "
    "MiB of KV added on this machine.",
}
CASE_TITLES = {"room": "the room (short chat prompts)", "long": "long prompts", "live": "live replay"}


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


def decode_steps(result: dict) -> pd.DataFrame:
    """Every decode-only step (each running sequence fed its one new token) of the lossless replays: case,
    sequences decoding, KV bytes read (the cache tensors' bytes) and the step's measured seconds."""
    rows = []
    for case, stored in result["cases"].items():
        for r in stored["replays"]:
            if not r.get("fits") or r["mode"] in LOSSY:
                continue
            s = r["steps"]
            for run, fed, kv, sec in zip(s["running"], s["fed_tokens"], s["tensor_bytes"], s["seconds"]):
                if fed == run:
                    rows.append({"case": case, "running": run, "kv_bytes": kv, "seconds": sec})
    return pd.DataFrame(rows, columns=["case", "running", "kv_bytes", "seconds"])


def decode_time_figure(result: dict) -> go.Figure:
    """Measured decode-step time against the KV read, per case, at the batch size the cases share (one sequence
    when both have it: a bigger batch reads more KV and computes more at once, so only one batch size compares
    the KV alone); the title gives each case's medians."""
    steps = decode_steps(result)
    if steps.empty:
        return empty_figure("No decode-only steps stored")
    batch = _shared_batch(steps)
    if batch is not None:
        steps = steps[steps["running"] == batch]
    fig = go.Figure()
    for case, part in steps.groupby("case", sort=False):
        fig.add_trace(
            go.Scatter(
                x=part["kv_bytes"] / 2**20,
                y=part["seconds"] * 1000,
                mode="markers",
                marker={"size": 6, "opacity": 0.6},
                name=CASE_TITLES.get(str(case), str(case)),
                customdata=part["running"],
                hovertemplate="%{x:,.1f} MiB of KV, %{customdata} decoding: %{y:.1f} ms<extra></extra>",
            )
        )
    fig.update_layout(
        title=_decode_title(steps, batch),
        xaxis_title="KV read by the step (MiB)",
        yaxis_title="step time (ms, measured)",
        yaxis_rangemode="tozero",
        height=420,
        legend={"orientation": "h", "yanchor": "top", "y": -0.2},
    )
    return fig


def _shared_batch(steps: pd.DataFrame) -> int | None:
    """The batch size every case has decode steps at: one when they all do, else the most common shared one."""
    cases = list(dict.fromkeys(steps["case"]))
    shared = set.intersection(*(set(steps.loc[steps["case"] == c, "running"]) for c in cases))
    if len(cases) < 2 or not shared:
        return None
    return 1 if 1 in shared else max(shared, key=lambda b: int((steps["running"] == b).sum()))


def _decode_title(steps: pd.DataFrame, batch: int | None) -> str:
    if batch is None:
        return f"Decode steps: median {steps['seconds'].median() * 1000:.1f} ms"
    parts = [
        f"{CASE_TITLES.get(str(c), c)}: {g['seconds'].median() * 1000:.1f} ms at {g['kv_bytes'].median() / 2**20:,.1f} MiB"
        for c, g in steps.groupby("case", sort=False)
    ]
    who = "one sequence" if batch == 1 else f"{batch} sequences"
    return f"Median decode step, {who} decoding · " + " vs ".join(parts)
