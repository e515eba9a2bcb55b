"""The layout the per-step charts share (Generate's cache growth, the debugger's divergence map): decode
steps on x counted from the prefill (0), whole-number ticks, the same title and margins, so two views of
one run read alike and a change to that frame is made once."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

STEP_AXIS = "step (0 = prefill)"
MARGIN = dict(l=50, r=20, t=50, b=40)


def per_step(fig: go.Figure, title: str, yaxis_title: str, height: int, **layout: Any) -> go.Figure:
    """``fig`` with steps on x (whole numbers) and the shared frame; ``layout`` adds the chart's own."""
    fig.update_xaxes(tickformat="d")
    fig.update_layout(
        title=title, xaxis_title=STEP_AXIS, yaxis_title=yaxis_title, height=height, margin=MARGIN, **layout
    )
    return fig
