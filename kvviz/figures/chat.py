"""Figures for the Generate tab's chat: what each turn reused from the previous turn's cache.

Pure functions of :class:`~kvviz.chat.turns.TurnReport` values (one per turn, in order); each view has
a one-sentence caption in ``CAPTIONS``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import plotly.graph_objects as go

from kvviz.chat.turns import TurnReport

REUSED, COMPUTED, DIVERGED = "#6baed6", "#fd8d3c", "#d62728"
CAPTIONS = {
    "turns": "Each turn's prompt in tokens: blue came from the previous turn's cache through the prefix store, "
    "orange was computed; the red mark is the first position where the new prompt differs from the tokens the "
    "previous turn held (its prompt and answer), where a template that rewrites history stops reuse.",
    "diff": "The chat template's text around the first difference: what both turns share, then what the "
    "previous turn held and what the new prompt has instead.",
}


def turns_figure(reports: Sequence[TurnReport]) -> go.Figure:
    """One horizontal bar per turn, reused then computed prompt tokens, and a mark where the prompt diverged."""
    names = [f"turn {r.turn}" for r in reports]
    fig = go.Figure()
    fig.add_bar(
        y=names,
        x=[r.reused for r in reports],
        orientation="h",
        name="reused from the cache",
        marker_color=REUSED,
        hovertemplate="%{x:,} tokens reused<extra></extra>",
    )
    fig.add_bar(
        y=names,
        x=[r.computed for r in reports],
        orientation="h",
        name="computed",
        marker_color=COMPUTED,
        hovertemplate="%{x:,} tokens computed<extra></extra>",
    )
    marked = [r for r in reports if r.diverged is not None]
    if marked:
        fig.add_scatter(
            y=[f"turn {r.turn}" for r in marked],
            x=[r.diverged for r in marked],
            mode="markers",
            marker={"symbol": "line-ns", "size": 26, "line": {"width": 3, "color": DIVERGED}},
            name="first difference from the previous turn",
            hovertemplate="differs from position %{x:,}<extra></extra>",
        )
    fig.update_layout(
        barmode="stack",
        height=170 + 36 * len(reports),
        margin={"l": 60, "r": 20, "t": 60, "b": 40},
        xaxis_title="prompt tokens",
        yaxis={"autorange": "reversed"},
        legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
    )
    return fig


def _shown(text: str) -> str:
    """Template text as it reads: newlines as ⏎, HTML escaped."""
    return html.escape(text.replace("\r", "").replace("\n", "⏎"))


def divergence_text(report: TurnReport | None) -> str:
    """The verdict of the latest turn and, where its prompt differs from the previous turn, the text around it."""
    if report is None:
        return ""
    out = f"**{report.verdict()}**"
    if report.diverged is None:
        return out
    return (
        out + f"<br>At token {report.diverged:,}: <code>…{_shown(report.before)}</code>"
        f" then the previous turn held <code>{_shown(report.was)}…</code>"
        f" but the new prompt has <code>{_shown(report.now)}…</code>"
    )


def look_for(reports: Sequence[TurnReport]) -> str:
    """The Learn tab's "Look for" line for a conversation: what the latest turn read from the previous turn's cache,
    with the numbers its verdict (:func:`divergence_text`) gives."""
    r, first = reports[-1], reports[0]
    start = "the first bar is all orange, computed with nothing to start from; " if first.reused == 0 else ""
    return (
        f"The bars: {start}the last turn read {r.reused:,} of its {r.prompt_tokens:,} prompt tokens from the previous "
        f"turn's cache (blue) — its prompt and its answer, kept in the prefix store — and computed only "
        f"{r.computed:,} (orange)."
    )
