"""The Generate tab's components, declared once by name: what a request reads (:class:`Form`, the widgets'
raw values under the same names) and what a run shows (:class:`Views`).

Handlers answer ``{component: value}`` with only what changed (Gradio leaves the rest alone), so no list of
outputs is kept in step anywhere. A chart of the run is one field here made with :func:`chart`: the tab lays
it out with its caption (``figures.generate.CAPTIONS[name]``), a streamed run draws it on the charts' pace,
a stored run and a refusal reach it like every other view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import gradio as gr
import plotly.graph_objects as go
from gradio.components import Component

from kvviz.capture.trace import ModelInfo, Trace
from kvviz.chat.history import MODEL
from kvviz.examples import GENERATE_EXAMPLE, examples
from kvviz.figures import generate as fig


@dataclass(frozen=True)
class Form:
    """The tab's inputs by name, raw as its widgets hold them (:func:`ask` checks them). The defaults are what
    the tab opens on: the stored chat example, greedy, served from the store unless "Recompute live"."""

    prompt: str = field(default_factory=lambda: examples()[GENERATE_EXAMPLE][0])
    chat: bool = True
    max_new: Any = 48
    temperature: Any = 0.0
    top_p: Any = 1.0
    seed: Any = 0
    budget: str = "T4 (16 GB)"
    fresh: bool = False  # "Recompute live": skip a stored result
    multi: bool = False  # the chat section: the next turn of ``conversation``
    template: str = MODEL
    conversation: Any = None


@dataclass(frozen=True)
class Frame:
    """One run's constants a chart may need: the model, and the GPU budget the gauge measures against."""

    info: ModelInfo
    budget_label: str
    budget_bytes: float | None
    room_tokens: int | None


Draw = Callable[[Trace, Frame], go.Figure]


def chart(label: str, elem_id: str, draw: Draw) -> Any:
    """A field of :class:`Views` that is a chart of the run: its label, its page id, how it is drawn."""
    return field(default=None, metadata={"label": label, "elem_id": elem_id, "draw": draw})


@dataclass(frozen=True)
class Views:
    """Every component of the tab a handler reads or writes. ``inputs`` are the request's widgets under
    :class:`~kvviz.ui.generate.run.Form`'s field names; the rest is what a run shows."""

    inputs: dict[str, Component]
    trace: Component  # the session's finished trace (``ctx.trace_state``), read by the other tabs
    status: Component
    tokens: Component
    answer: Component
    check: Component
    waste: Component
    npz: Component
    csv: Component
    step: Component  # the replay slider
    redraw: Component  # the hidden box a run's in-between charts go through (kvviz/ui/page/plot_redraw.py)
    # the run's charts, side by side in this order
    growth: Component = chart("Cache growth", "cache-growth", lambda trace, frame: fig.cache_growth(trace))
    gauge: Component = chart(
        "Memory gauge",
        "memory-gauge",
        lambda trace, frame: fig.memory_gauge(
            trace.cache_bytes, frame.info.weight_bytes, frame.budget_bytes, frame.budget_label, frame.room_tokens
        ),
    )

    def form(self, values: dict[Component, Any]) -> Form:
        """The widgets' values (Gradio's dict for a set of inputs) as the form."""
        return Form(**{name: values[c] for name, c in self.inputs.items()})

    def charts(self) -> dict[Component, Draw]:
        """Each chart's component and how it is drawn."""
        return {getattr(self, f.name): f.metadata["draw"] for f in fields(self) if "draw" in f.metadata}

    def shown(self) -> list[Component]:
        """What a run shows on the page (a refusal clears these; the trace and the slider stay)."""
        return [self.status, self.tokens, self.answer, *self.charts(), self.check, self.waste, self.npz, self.csv]

    def outputs(self) -> list[Component]:
        """Every component a run may write."""
        return [self.trace, *self.shown(), self.step, self.redraw]


def blank_charts(frame: Frame) -> dict[str, go.Figure]:
    """Each chart of :class:`Views` drawn for no run yet (a trace of no tokens), by field name: the cache-growth
    chart's axes, the gauge's weights beside the GPU budget. The page opens on them, so a run's charts, its first
    ones too, are redrawn in place (:mod:`kvviz.ui.page.plot_redraw`) instead of each plot building its chart."""
    none = Trace(model=frame.info, prompt="", chat=False, settings={}, token_ids=[], tokens=[], n_prompt=0)
    return {f.name: f.metadata["draw"](none, frame) for f in fields(Views) if "draw" in f.metadata}


def chart_plots(values: dict[str, go.Figure] | None = None) -> dict[str, Component]:
    """Lay out the charts declared on :class:`Views`, each in a column of the caller's row with its caption,
    drawn with ``values`` (by field name; :func:`blank_charts`); by field name."""
    plots = {}
    for f in fields(Views):
        if "draw" in f.metadata:
            with gr.Column(scale=1, min_width=320):
                value = (values or {}).get(f.name)
                plots[f.name] = gr.Plot(value, label=f.metadata["label"], elem_id=f.metadata["elem_id"])
                gr.Markdown(fig.CAPTIONS[f.name])
    return plots
