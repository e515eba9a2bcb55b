"""The disk tier made visible: a small store spills prompt A's blocks to disk and reads them back, the room's
table names what its bytes count beside the Blocks view's keys-and-values blocks, and the Blocks tab offers the
demo as a stored show-me (``blocks.disk_demo``)."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.demo_files import DemoFiles
from kvviz.engine.disk_demo import MEMORY_BLOCKS, ORDER, PROMPT_TOKENS, spill_demo
from kvviz.engine.prefix import BlockInfo, StoreView
from kvviz.figures import blocks_room as fig
from kvviz.settings import Settings
from kvviz.ui.blocks import room
from kvviz.ui.serving.context import AppContext

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(lm):
    return spill_demo(lm)


def test_blocks_spill_to_disk_and_come_back(demo, lm):
    a, b, c, again = demo.steps
    assert [s.prompt for s in demo.steps] == list(ORDER)
    assert a.sources.computed == PROMPT_TOKENS and a.disk_blocks == 0
    assert b.disk_blocks > 0 and b.disk_bytes >= b.disk_blocks * demo.block_bytes  # evicted to disk (files), not lost
    usable = (PROMPT_TOKENS - 1) // 8 * 8  # the last prompt token is always computed
    assert again.sources.disk == usable and again.sources.computed == PROMPT_TOKENS - usable
    assert all(s.memory_bytes <= demo.memory_capacity == MEMORY_BLOCKS * demo.block_bytes for s in demo.steps)
    text = fig.disk_demo_summary(demo)
    assert f"**{usable} of its {PROMPT_TOKENS} prompt tokens came back from disk**" in text
    assert f"After prompt B, **{b.disk_blocks} blocks" in text
    table = fig.disk_demo_table(demo)
    assert list(table["from disk"]) == [0, 0, 0, usable]


def test_the_demo_is_stored_like_the_other_show_mes(demo, tmp_path):
    files = DemoFiles(tmp_path, "SmolLM2", "v1", where="test machine")
    files.save(("disk",), demo)
    assert files.load(("disk",))[0] == demo


def test_the_blocks_tab_offers_it_as_a_show_me(lm, demo):
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks():
        room.build(ctx)
    assert "blocks.disk_demo" in ctx.components and "blocks.disk_demo" in ctx.planners
    assert ctx.planners["blocks.disk_demo"]({}) == room.disk_key(ctx)
    shown = room.disk_outputs(demo, "run now")
    summary, table, chart = shown.summary, shown.table, shown.chart
    assert "came back from disk" in summary and len(table) == len(ORDER)
    assert [t.name for t in chart.data] == ["computed", "memory hit", "disk hit"]


def test_the_room_names_what_its_block_bytes_count(lm):
    bpt = AppContext(lm=lm, settings=Settings()).info.kv_bytes_per_token  # 46,080 B for SmolLM2 in fp32
    ids = tuple(range(8))
    view = StoreView([BlockInfo("aa" * 32, None, 0, ids, 0, 1, 1_468_416)], {"block_size": 8, "blocks": 1})
    text = fig.room_summary(view, bpt)
    assert f"its keys and values are 8 × {bpt:,} B = 360 KiB" in text
    assert "whose 16 tokens hold 720 KiB" in text and "attention rows" in text
    table = fig.room_table(view, ["hi"], bpt)
    assert table[fig.ROWS_BYTES].tolist() == ["1.4 MiB"] and table[fig.KV_BYTES].tolist() == ["360 KiB"]


def test_the_blocks_view_says_its_block_is_keys_and_values_only():
    from kvviz.blocks.table import block_table
    from kvviz.figures import blocks as fig_blocks

    table = block_table([20] * 30, [20 * 1536] * 30, 3, 16)  # SmolLM2: 1,536 B per token and layer
    text = fig_blocks.table_summary(table, [], "a run")
    assert "16 tokens × 46,080 B = **720 KiB**" in text and "of keys and values" in text
    assert "also keeps each block's attention rows" in text
