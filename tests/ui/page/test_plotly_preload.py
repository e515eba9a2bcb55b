"""The plotly preload finds the installed Gradio's chunk (a Gradio upgrade that moves it fails here, not silently)."""

from __future__ import annotations

from kvviz.ui.page.plotly_preload import HEAD, plotly_chunk


def test_the_installed_gradio_has_one_plotly_chunk_and_the_page_imports_it():
    name = plotly_chunk()
    assert name is not None and name.startswith("PlotlyPlot-") and name.endswith(".js")
    assert f'"{name}"' in HEAD
