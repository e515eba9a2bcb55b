"""A streamed chart's figure reaches the page's own plotly through the hidden box, by the chart's page id."""

from __future__ import annotations

import json

import gradio as gr
import plotly.graph_objects as go

from kvviz.ui.page.plot_redraw import REDRAW_JS, payload, redraw_box


def test_the_payload_names_each_chart_by_its_page_id_with_its_figure():
    with gr.Blocks():
        growth = gr.Plot(label="Growth", elem_id="g1")
        bare = gr.Plot(elem_id="g2", show_label=False)
    figure = go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 2, 3]), layout={"title": "t"})
    sent = json.loads(payload({growth: figure, bare: go.Figure()}))
    assert [(c["id"], c["label"]) for c in sent] == [("g1", True), ("g2", False)]
    assert json.loads(sent[0]["figure"])["data"][0]["x"] == [0, 1, 2]


def test_the_box_is_hidden_and_its_change_runs_in_the_page_only():
    with gr.Blocks() as demo:
        box = redraw_box("redraw-here")
    assert box.visible == "hidden" and box.elem_id == "redraw-here"
    (dep,) = [d for d in demo.config["dependencies"] if [box._id, "change"] in [list(t) for t in d["targets"]]]
    assert dep["js"] == REDRAW_JS and dep["backend_fn"] is False and dep["queue"] is False
