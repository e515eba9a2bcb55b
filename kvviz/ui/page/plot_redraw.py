"""A streamed chart redrawn in place: the figure goes to a hidden box, and the page hands it to plotly's ``react``.

Gradio's ``gr.Plot`` builds its chart anew for every new value (the plotly element is removed and a fresh one made,
toolbar and all), which costs a page about four times what plotly's own ``react`` on the drawn chart does, loses the
tooltip a lecturer is hovering over, and on a machine shared with the model takes the model's cores
(``bench/page_speed.py``). The Generate tab's plots open on a chart (its blank charts, or the opening example's), so
a run that streams its charts sends every figure but its last through :func:`redraw_box` (the last goes through the
``gr.Plot``, whose value it becomes): :data:`REDRAW_JS` gives each figure to ``Plotly.react`` on the chart already
on the page, laid out as Gradio's own plot draws one (its size follows the box; a labelled chart's title keeps room
under the label). A chart not on the page yet is left for the next value through its ``gr.Plot``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import gradio as gr
import plotly.graph_objects as go
from gradio.components import Component

REDRAW_JS = """(value) => {
  if (!value || !window.Plotly) return [];
  for (const {id, figure, label} of JSON.parse(value)) {
    const chart = document.querySelector('#' + id + ' .js-plotly-plot');
    if (!chart) continue;
    const f = JSON.parse(figure), layout = f.layout || {};
    layout.autosize = true;
    layout.margin = Object.assign({}, layout.margin);
    if (layout.title && label) layout.margin.t = Math.max(100, layout.margin.t || 0);
    layout.margin.autoexpand = true;
    window.Plotly.react(chart, f.data, layout, Object.assign({}, f.config, {responsive: true}));
  }
  return [];
}"""


def redraw_box(elem_id: str) -> gr.Textbox:
    """The hidden box a run streams its in-between figures to (:func:`payload`), wired to :data:`REDRAW_JS` in the
    page (no server round trip). Call it inside the Blocks that holds the charts."""
    box = gr.Textbox(visible="hidden", elem_id=elem_id)
    box.change(None, box, None, js=REDRAW_JS, queue=False, api_name=False, show_progress="hidden")
    return box


def payload(figures: Mapping[Component, go.Figure]) -> str:
    """The box's value for these charts: each ``gr.Plot``'s page id, whether it shows its label, and its figure."""
    return json.dumps(
        [
            {"id": plot.elem_id, "label": bool(getattr(plot, "show_label", True)), "figure": figure.to_json()}
            for plot, figure in figures.items()
        ]
    )
