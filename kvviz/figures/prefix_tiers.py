"""Figures for the Blocks view's reuse sections: where each request's prompt came from, what a page size
costs, and what a shared cache tells a second user.

Pure functions of plain values (the store's :class:`~kvviz.engine.prefix.RequestSources`, a
:func:`~kvviz.blocks.page_size.replay` frame, a :class:`~kvviz.engine.side_channel.Leak`); each figure has
a one-sentence caption in ``CAPTIONS``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from kvviz.engine.prefix import RequestSources
from kvviz.engine.side_channel import Leak

COLOURS = {"computed": "#bdbdbd", "memory": "#3182bd", "disk": "#756bb1"}
NAMES = {"computed": "computed", "memory": "memory hit", "disk": "disk hit"}
CAPTIONS = {
    "sources": "Each recent request's prompt tokens by where their keys and values came from: computed by its "
    "prefill (grey), found in the prefix store's memory (blue) or read back from its disk tier (purple); the "
    "last prompt token is always computed.",
    "pages": "The room's requests replayed through a prefix cache at each block size: the tokens a request "
    "shares with an earlier one but recomputes, because only full blocks that match to their end are reused "
    "(the partial-page loss), and the block hit rate.",
    "leak": "Time to first token of a second session's request, per try: when another session already sent the "
    "same prefix it answers much sooner (an unsalted store), which tells the second session what the first "
    "sent; with per-session salts both cases take the prefill's time.",
}


def sources_bar(requests: Sequence[RequestSources]) -> go.Figure:
    """A stacked bar per request: prompt tokens computed, memory hits, disk hits."""
    fig = go.Figure()
    labels = [f"#{r.number}" for r in requests]
    for key in ("computed", "memory", "disk"):
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[getattr(r, key) for r in requests],
                name=NAMES[key],
                marker_color=COLOURS[key],
                hovertemplate="request %{x}: %{y} tokens " + NAMES[key] + "<extra></extra>",
            )
        )
    title = "Where each request's prompt came from" if requests else "No request has reached the store yet"
    fig.update_layout(
        barmode="stack",
        title=title,
        xaxis_title="request (latest last)",
        yaxis_title="prompt tokens",
        height=320,
        margin={"l": 50, "r": 10, "t": 50, "b": 40},
        legend={"orientation": "h", "y": -0.3},
    )
    return fig


def page_size_chart(frame: pd.DataFrame) -> go.Figure:
    """Partial-page loss and recomputed tokens per request (bars) and hit rate (line) per block size."""
    sizes = [str(b) for b in frame["block size (tokens)"]]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=sizes, y=frame["reused tokens per request"], name="reused", marker_color=COLOURS["memory"]))
    fig.add_trace(
        go.Bar(x=sizes, y=frame["partial-page loss per request"], name="shared but recomputed", marker_color="#e6550d")
    )
    other = frame["recomputed tokens per request"] - frame["partial-page loss per request"]
    fig.add_trace(go.Bar(x=sizes, y=other, name="the request's own tokens", marker_color=COLOURS["computed"]))
    fig.add_trace(
        go.Scatter(
            x=sizes,
            y=frame["hit rate"] * 100,
            name="block hit rate (%)",
            yaxis="y2",
            mode="lines+markers",
            line_color="black",
        )
    )
    fig.update_layout(
        barmode="stack",
        title=f"Page size costs reuse: {int(frame['requests'].iloc[0])} room requests replayed",
        xaxis_title="block size (tokens)",
        yaxis={"title": "prompt tokens per request"},
        yaxis2={"title": "block hit rate (%)", "overlaying": "y", "side": "right", "range": [0, 100]},
        height=360,
        margin={"l": 50, "r": 50, "t": 50, "b": 40},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def page_size_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The replay's numbers, rounded for reading."""
    out = frame.copy()
    out["hit rate"] = [f"{x:.0%}" for x in out["hit rate"]]
    for col in out.columns[3:]:
        out[col] = out[col].round(1)
    return out


def leak_chart(leak: Leak) -> go.Figure:
    """Each try's time to first token, per store (unsalted, salted) and case (prefix sent before or not)."""
    fig = go.Figure()
    for salted in (False, True):
        for hit in (True, False):
            ys = leak.seconds(salted, hit)
            store = "salted" if salted else "shared"
            case = "prefix already sent" if hit else "prefix new"
            fig.add_trace(
                go.Box(
                    y=[s * 1000 for s in ys],
                    name=f"{store}: {case}",
                    boxpoints="all",
                    marker_color=COLOURS["memory"] if hit else COLOURS["computed"],
                    hovertemplate="%{y:.0f} ms<extra></extra>",
                )
            )
    fig.update_layout(
        title=f"A second session's time to first token, {leak.tries} tries each ({leak.prompt_tokens}-token prompts)",
        yaxis_title="time to first token (ms)",
        showlegend=False,
        height=360,
        margin={"l": 60, "r": 10, "t": 50, "b": 60},
    )
    return fig
