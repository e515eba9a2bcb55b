"""The Blocks tab's KV events: the export button writes the store's log, and an imported log draws its prefix tree."""

from __future__ import annotations

import json

import gradio as gr
import pytest

from kvviz.engine.handle import wait_all
from kvviz.figures.blocks_room import GONE, ROOT
from kvviz.settings import Settings
from kvviz.ui.blocks import events as blocks_events
from kvviz.ui.blocks import room as blocks_room
from kvviz.ui.serving.context import AppContext
from tests.engine.test_kv_events import VLLM_LOG


def _handler(demo: gr.Blocks, elem_id: str, event: str):
    for fn in demo.fns.values():
        block = demo.blocks.get(fn.targets[0][0]) if fn.targets else None
        if getattr(block, "elem_id", None) == elem_id and fn.targets[0][1] == event:
            return fn.fn
    raise AssertionError(f"no {event} handler on #{elem_id}")


@pytest.mark.slow
def test_the_exported_log_imports_back_into_the_same_tree(lm, tmp_path):
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks() as demo:
        blocks_room.build(ctx)
    handles = [ctx.engine.submit(p, chat=True, max_new_tokens=2) for p in ("What is a cache?", "What is a key?")]
    assert wait_all(handles, 600)
    path = _handler(demo, "room-events-export", "click")(None)
    note, tree = _handler(demo, "room-events-import", "upload")(path)
    cached = ctx.engine.prefix.blocks().blocks
    assert note.startswith(f"{len(cached)} blocks") and len(cached) > 0
    drawn = set(tree.data[0].ids) - {ROOT, GONE}
    assert drawn == {b.block_hash for b in cached}
    ctx.engine.close()


def test_a_log_vllm_wrote_imports_into_a_tree(lm, tmp_path):
    ctx = AppContext(lm=lm, settings=Settings())
    with gr.Blocks() as demo:
        blocks_room.build(ctx)
    log = tmp_path / "vllm-events.jsonl"
    log.write_text("\n".join(json.dumps(batch) for batch in VLLM_LOG))
    note, tree = _handler(demo, "room-events-import", "upload")(str(log))
    assert note.startswith("2 blocks")
    assert dict(zip(tree.data[0].ids, tree.data[0].parents))["13"] == "11"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(gr.Error, match="Line 1"):
        _handler(demo, "room-events-import", "upload")(str(bad))
    assert blocks_events.imported_view("").blocks == []
