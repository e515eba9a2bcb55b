"""A model job's result given by name crosses ZeroGPU's process boundary: the components stay behind, their values
go back as plain data in the event's output order."""

from __future__ import annotations

import pickle

import gradio as gr

from kvviz.ui.serving.model_job import _plain


def test_a_result_by_name_becomes_picklable_values_in_output_order():
    with gr.Blocks():
        status, chart, table = gr.Markdown(), gr.Plot(), gr.Dataframe()
    by_name = {chart: "the chart", status: "the status"}
    plain = _plain(by_name, [status, chart, table])
    assert plain == ["the status", "the chart", gr.skip()]  # left out: left as it is
    assert pickle.loads(pickle.dumps(plain)) == plain
    assert _plain({status: "only"}, [status]) == "only"  # one output: its value itself
    assert _plain(("a", "b"), [status, chart]) == ("a", "b")  # a result by position passes unchanged
