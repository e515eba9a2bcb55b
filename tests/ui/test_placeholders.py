"""Before a run, every table says what fills it instead of Gradio's bare "1 | 2 | 3" headers."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.settings import Settings
from kvviz.ui import attention as tab_attention
from kvviz.ui import nocache as tab_nocache
from kvviz.ui import quant as tab_quant
from kvviz.ui.blocks import tab as tab_blocks
from kvviz.ui.eviction import tab as tab_eviction
from kvviz.ui.memory import tab as tab_memory
from kvviz.ui.serving.context import AppContext


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings())


@pytest.mark.parametrize("module", [tab_attention, tab_blocks, tab_eviction, tab_memory, tab_nocache, tab_quant])
def test_tables_say_what_fills_them(ctx, module):
    with gr.Blocks() as demo:
        ctx.trace_state = gr.State(None)  # the Generate tab's run, which the Attention tab reads
        module.build(ctx)
    tables = [b for b in demo.blocks.values() if isinstance(b, gr.Dataframe)]
    assert tables
    for table in tables:
        headers = table.value["headers"]
        assert headers and headers != ["1", "2", "3"], table.label
        assert len(table.value["data"]) > 0 or headers[0].startswith("Press "), table.label
