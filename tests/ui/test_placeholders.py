"""Before a run, every table says what fills it instead of Gradio's bare "1 | 2 | 3" headers."""

from __future__ import annotations

import re

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

GENERATE = "Generate"  # the Generate tab's button, which fills the tabs that read its run


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings())


@pytest.mark.parametrize("module", [tab_attention, tab_blocks, tab_eviction, tab_memory, tab_nocache, tab_quant])
def test_tables_say_what_fills_them(ctx, module):
    with gr.Blocks() as demo:
        ctx.trace_state = gr.State(None)  # the Generate tab's run, which the Attention tab reads
        module.build(ctx)
    tables = [b for b in demo.blocks.values() if isinstance(b, gr.Dataframe)]
    buttons = {b.value for b in demo.blocks.values() if isinstance(b, gr.Button)} | {GENERATE}
    assert tables, "every tab here shows at least one table"
    for table in tables:
        headers, rows = table.value["headers"], table.value["data"]
        assert headers and headers != [str(i) for i in range(1, len(headers) + 1)], table.label
        if rows:  # filled at build time: every row fills every column
            assert all(len(row) == len(headers) and all(str(c).strip() for c in row) for row in rows), table.label
            continue
        press = re.match(r"Press (.+?) (?:to |on the \w+ tab)", headers[0])
        assert press and press.group(1) in buttons, (table.label, headers[0], sorted(buttons))
