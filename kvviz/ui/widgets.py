"""Page pieces every tab uses: a chart with the one sentence that explains it."""

from __future__ import annotations

import gradio as gr


def captioned_plot(label: str, elem_id: str, caption: str, value=None) -> gr.Plot:
    """A chart in its own column with its caption underneath (hidden in presentation mode)."""
    with gr.Column():
        plot = gr.Plot(value, label=label, elem_id=elem_id)
        gr.Markdown(caption, elem_classes="caption")
    return plot
