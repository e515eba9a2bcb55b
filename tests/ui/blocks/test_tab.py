"""Blocks tab and the Memory tab's engine section, in-process on the real model: views, checks, gate, endpoint."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.capture.loop import capture
from kvviz.settings import Settings
from kvviz.ui.blocks import eviction as blocks_eviction
from kvviz.ui.blocks import sharing as blocks_sharing
from kvviz.ui.blocks import tab
from kvviz.ui.memory import startup as memory_engine
from kvviz.ui.memory.startup import EngineForm
from kvviz.ui.serving.context import AppContext

H100 = "H100 80GB (SXM)"


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings(max_new_tokens=64))


@pytest.fixture(scope="module")
def trace(lm):
    return capture(lm, "Name three colours.", chat=True, max_new_tokens=12)


def test_views_of_a_generate_run(trace):
    shown = tab.views(trace, 16, 0, 3)
    summary, grid, slots, alloc, table = shown.summary, shown.grid, shown.slots, shown.alloc, shown.table
    n = trace.n_prompt
    blocks = -(-n // 16)
    assert f"**{n} tokens** in blocks of **16** → **{blocks} blocks** per layer and KV head" in summary
    assert f"**{blocks * 16 - n} slots are empty**" in summary
    assert "16 tokens × 46,080 B = **720 KiB**" in summary and "(8 KiB per layer and KV head)" in summary
    assert "contiguous: model context" in summary
    assert len(grid.data[0].z) == 30 * 3 and len(table) == 30
    assert grid.layout.title.text.startswith(f"{n} tokens → {blocks} blocks of 16 slots per layer and KV head ·")
    assert grid.data[0].text[4][blocks - 1].startswith(f"layer 1, KV head 1: block {blocks - 1} holds")
    assert slots.layout.title.text.startswith(f"Layer 3: {n} entries in {blocks} blocks of 16 slots")
    assert alloc.layout.title.text.startswith("Paging wastes")
    later = tab.views(trace, 8, 99, 0).summary  # clamped to the last step: every fed token
    assert f"**{trace.n_fed} tokens** in blocks of **8**" in later
    assert tab.views(None, 16, 0, 0) == tab.BlockViews(tab.EMPTY, None, None, None, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((12, 0, 0), "Block size must be one of 8, 16, 32"),
        ((16, 2.5, 0), "Step"),
        ((16, 0, 30), "Layer"),
        (("sixteen", 0, 0), "Block size"),
    ],
)
def test_bad_view_input_is_a_readable_error(trace, args, message):
    with pytest.raises(gr.Error, match=message):
        tab.views(trace, *args)


def test_own_prompt_runs_through_the_gate(ctx):
    result = tab.run_prompt(ctx, "Hello!", True, 3, None)
    assert result.n_generated >= 1 and ctx.jobs.gate.snapshot()["running"] == 0
    with pytest.raises(gr.Error, match="empty"):
        tab.run_prompt(ctx, "   ", True, 3, None)
    with pytest.raises(gr.Error, match="Tokens to generate"):
        tab.run_prompt(ctx, "Hello!", True, 1000, None)


def test_section_checks():
    assert blocks_eviction.check_policy(None, None) is None
    assert blocks_eviction.check_policy("snapkv", 20).window_size == 10
    with pytest.raises(gr.Error, match="Pick a policy"):
        blocks_eviction.check_policy("full", 20)
    with pytest.raises(gr.Error, match="Budget"):
        blocks_eviction.check_policy("h2o", 0)


def test_endpoint_gives_the_cli_json(ctx):
    out = tab.api_blocks(ctx, ["Student 1 asks: why?", "Student 1 asks: how?"], True, 8, "streaming_llm", 12)
    a, b = out["prompts"]
    assert out["block_size"] == 8 and out["shared_blocks"] >= 2 and b["cached_blocks"] == out["shared_blocks"]
    assert out["bytes_saved"] == out["shared_blocks"] * 8 * 46_080
    assert all(h == a["prompt_tokens"] - 12 for layer in a["tokens_evicted"] for h in layer)
    with pytest.raises(gr.Error, match="empty"):
        tab.api_blocks(ctx, ["  ", ""])
    with pytest.raises(gr.Error, match="At most 4"):
        blocks_sharing.check_prompts(ctx, ["a"] * 5)


def test_tab_builds_registers_inputs_and_the_endpoint(ctx):
    with gr.Blocks() as demo:
        ctx.trace_state = gr.State(None)
        tab.build(ctx)
    for key in ("prompt", "block_size", "run", "step", "share_run", "evict_run"):
        assert f"blocks.{key}" in ctx.components
    params = [p["parameter_name"] for p in demo.get_api_info()["named_endpoints"]["/blocks"]["parameters"]]
    assert params == ["prompts", "chat", "block_size", "policy", "budget"]
    assert ctx.listeners, "refreshes after every Generate run"


def test_engine_section_chapter_example_and_refusals(ctx):
    def view(**named):
        return memory_engine.startup_view(
            ctx, EngineForm(**{"gpu_name": H100, "gpu_mem_gb": 80, "batched": 2048, **named})
        )

    chapter = view()
    md, groups, chart = chapter.text, chapter.groups, chapter.chart
    assert "INFO GPU KV cache size: 1,330,560 tokens ³" in md
    assert "INFO Maximum concurrency for 8,192 tokens per request: 162.42x ⁴" in md
    assert "⌊54,500,000,000 B / 655,360 B per block⌋ = 83,160 blocks" in md
    assert list(groups["layers"]) == [80]
    concurrency = dict(zip(chart.data[0].x, chart.data[0].y))  # the chart's curve passes the log's figure
    assert concurrency[8192] == 1_330_560 / 8192 and chart.layout.title.text.startswith("83,160 blocks of 16 tokens")
    hybrid = view(model="gemma-2-9b", gpus=1, weights_gb=0)
    assert list(hybrid.groups["KV-cache groups"]) == [1, 1] and "2 groups" in hybrid.text
    small = view(model="Llama-3-8B", gpu_name="L4 24GB", gpus=1, gpu_mem_gb=24, max_model_len=131_072, weights_gb=0)
    assert "would refuse to start" in small.text
    refused = view(gpus=1, weights_gb=0)
    assert refused.text.startswith("⚠") and "do not fit" in refused.text and refused.groups is None
    loaded = view(
        model=memory_engine.LOADED, gpu_name="T4 16GB", gpus=1, gpu_mem_gb=16, max_model_len=0, batched=0, weights_gb=0
    )
    assert f"**{ctx.info.name}**" in loaded.text and "8,192 tokens per request" in loaded.text
    with pytest.raises(gr.Error, match="Number of GPUs"):
        view(gpus=-1)
