"""Memory tab handlers, in-process on the real bundled model: outputs, validation, the live cache check."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import gradio as gr
import pytest

from kvviz.settings import Settings
from kvviz.ui.memory import tab
from kvviz.ui.serving.context import AppContext
from kvviz.units import format_bytes

H100 = "H100 80GB (SXM)"


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings())


# the tab's opening example, with one model to compare
BASE = tab.Form(gpu=H100, gpus=8, gpu_mem_gb=80, bandwidth_tbps=3.35, weights_gb=None, compare=("Llama-3-8B",))


def calc(ctx, **changes) -> tab.Drawn:
    """The tab's outputs, by name, for its example with ``changes`` (the Form's field names)."""
    return tab.calculate(ctx, replace(BASE, **changes))


def test_chapter_example_is_the_default_view(ctx):
    out = calc(ctx, batch=162, weights_gb=0)  # the box's default
    summary, formula, table, size, cap, dec, gauge = (
        out.summary,
        out.formula,
        out.table,
        out.size,
        out.capacity,
        out.decode,
        out.gauge,
    )
    assert "**320 KiB/token**" in summary and "Weights: 140 GB, the figure the source uses" in summary
    assert "141.1 GB" in summary and "KV budget 436 GB = 406.1 GiB" in summary and "**162 sequences**" in summary
    assert "weights 5.22 ms + KV 16.23 ms" in summary
    assert "2 × 80 layers × 8 KV heads × 128 × 2 B" in formula
    assert list(table["KV per token"]) == ["2.5 MiB", "320 KiB", "40 KiB", "90 KiB"]
    assert [t.name for t in size.data] == ["Llama-3-70B (full)", "Llama-3-8B (full)"]
    assert "436 GB" in cap.layout.title.text and "8 × 3.35 TB/s" in dec.layout.title.text
    assert [t.name for t in dec.data] == ["weights (140 GB)", "KV of 162 sequences (or as many as fit)"]
    assert dec.data[1].x[-1] == "131,072<br>× 10" and dec.layout.title.text.startswith("At 8,192 tokens × 162")
    assert gauge.data[0].value == pytest.approx(100 * 434_865_438_720 / 436e9)  # 162 × 8K of the 436 GB budget


def test_kv_sharing_preset_and_the_producing_field(ctx):
    """The Gemma-4-E2B-like preset shows the published 37.58 GB vs 2.01 GB; the field shares any model."""
    out = calc(ctx, preset="Gemma-4-E2B-like", context=131_072)
    table, formula = out.table, out.formula
    shown = dict(zip(table["Attention"], table["decimal GB"]))
    assert shown["MHA, every layer (hypothetical)"] == "37.58 GB"
    assert shown["MQA + KV sharing (15 of 35 layers store) (this model)"] == "2.01 GB"
    assert "| 20 × shared | reuses an earlier layer's K/V: nothing of its own |" in formula
    table8 = calc(ctx, preset="Llama-3-8B", context=8192, kv_producing=16).table
    assert "MHA, every layer (hypothetical)" in set(table8["Attention"])
    assert "**512 MiB/sequence**" in calc(ctx, preset="Llama-3-8B", context=8192, kv_producing=16).summary
    with pytest.raises(gr.Error, match="KV-producing layers"):
        calc(ctx, preset="Llama-3-8B", kv_producing=33)


def test_typed_weights_override_the_stated_figure(ctx):
    summary = calc(ctx, batch=162, weights_gb=141.1).summary
    assert "weights 5.26 ms" in summary and "the figure the source uses" not in summary


def test_a_stated_head_dim_is_a_lesson(ctx):
    """Qwen3-0.6B states head_dim 128 where 1024 / 16 = 64: the page says why it doubles the article's 1.75 GB."""
    summary = calc(ctx, preset="Qwen3-0.6B", context=32_768).summary
    assert "**3.5 GiB/sequence**" in summary
    assert "states head_dim = 128, not hidden_size / heads = 1,024 / 16 = 64" in summary and "2×" in summary
    assert "head_dim" not in calc(ctx, preset="Llama-3-8B").summary


def test_weights_that_do_not_fit_keep_the_sizes(ctx):
    out = calc(ctx, preset="DeepSeek-V3", context=131_072)
    summary, formula, cap, dec, gauge = out.summary, out.formula, out.capacity, out.decode, out.gauge
    assert "**8.6 GiB/sequence**" in summary and "do not fit" in summary
    assert "**68.6 KiB/token**" in summary
    assert (
        "**68.6 GiB in total** (8.6 GiB per GPU)" in summary and "copied on each of the 8 TP ranks, so × 8" in summary
    )
    assert cap is None and dec is None and gauge is None and "(512 + 64)" in formula


def test_pasted_config_and_upload(ctx, tmp_path):
    cfg = {
        "model_type": "qwen3",
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_size": 1024,
    }
    summary = calc(ctx, source="Paste JSON", pasted=json.dumps(cfg), context=32_768).summary
    assert "1,879,048,192 B = **1.8 GiB/sequence**" in summary and "Give the weights" in summary
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    summary2 = calc(ctx, source="Upload config.json", upload=str(path), context=32_768, weights_gb=1.2).summary
    assert "1,879,048,192 B" in summary2 and "sequences" in summary2


def test_loaded_model_uses_its_real_weights(ctx):
    out = calc(ctx, source="Loaded model", context=1000, gpus=1, gpu="L4 24GB", gpu_mem_gb=24, bandwidth_tbps=0.3)
    summary, formula = out.summary, out.formula
    assert ctx.info.name in formula
    assert "2 × 30 layers × 3 KV heads × 64 × 2 B = **23,040 B = 22.5 KiB**" in formula
    assert f"minus weights {ctx.info.weight_bytes / 1e9:.2f} GB" in summary


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"source": "Paste JSON", "pasted": "/etc/passwd"}, "not valid JSON"),
        ({"source": "Paste JSON", "pasted": "{" + " " * (300 * 1024) + "}"}, "the limit is 262,144 bytes"),
        ({"source": "Paste JSON", "pasted": ""}, "Paste the model's config"),
        ({"source": "Upload config.json", "upload": None}, "Upload a config.json"),
        ({"preset": "Llama-9"}, "Unknown preset"),
        ({"context": 1.5}, "Context must be a whole number"),
        ({"context": 0}, "Context = 0 is outside the allowed range 1 … 134,217,728"),
        ({"batch": "many"}, "Batch must be a whole number"),
        ({"tp": 3}, "cannot split"),
        ({"kv_dtype": "fp6"}, "Unknown KV dtype"),
        ({"kv_dtype": "bf16", "group_size": 32}, "no per-group scales"),
        ({"gpu_mem_gb": -1}, "GPU memory (GB) = -1 is outside the allowed range 0.001 …"),
    ],
)
def test_bad_input_is_a_readable_error(ctx, kwargs, message):
    with pytest.raises(gr.Error) as err:
        calc(ctx, **kwargs)
    assert message in err.value.message and not err.value.message.startswith(("'", '"'))


def test_upload_must_be_json(ctx, tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x00\x01")
    with pytest.raises(gr.Error, match="Upload a .json file"):
        calc(ctx, source="Upload config.json", upload=str(path))


@pytest.mark.slow
def test_live_comparison_agrees_after_generate(ctx, lm):
    from kvviz.capture.loop import capture

    assert "run **Generate** first" in tab.live_comparison(ctx, None)
    trace = capture(lm, "The KV cache", chat=False, max_new_tokens=3, verify=False)
    text = tab.live_comparison(ctx, trace)
    assert "they agree, layer by layer ✓" in text
    assert f"{trace.cache_bytes:,} B" in text


def test_api_memory_matches_the_cli_json(ctx):
    from kvviz.memory.layout import cache_layout
    from kvviz.memory.report import MemoryRequest, report

    out = tab.api_memory(ctx, "llama-3-70b", 8192, 162, "bf16", None, 8, 80, 0.1, 140, 3.35)
    assert (
        out
        == report(
            MemoryRequest(
                cache_layout("Llama-3-70B"), 8192, 162, gpus=8, gpu_mem_gb=80, weights_gb=140, bandwidth_tbps=3.35
            )
        ).to_json()
    )
    assert out["max_sequences"] == 162
    with pytest.raises(gr.Error, match="config must be a preset"):
        tab.api_memory(ctx, "/etc/hosts")


def test_live_architecture_section_shows_the_real_cache_next_to_the_formula():
    from kvviz.ui.memory.architectures import show_architecture

    summary, table, chart, steps, attention = show_architecture("MLA", "The KV cache")
    assert "attention recorded on layers 0, 1; layer 1 shown" in attention.layout.title.text
    assert "equal, layer by layer, at every step ✓" in summary and "no factor 2 and no head count" in summary
    assert [len(t.x) for t in steps.data] == [8] * 4  # 2 layers × (measured, formula) after prefill + 7 steps
    assert list(table["tensors"]) == ["latent [1, 1, 19, 32] + RoPE key [1, 1, 19, 8]"] * 2
    assert [t.name for t in chart.data] == [
        "measured: latent + RoPE key",
        "formula (memory calculator)",
        "per-head K/V (the pitfall)",
    ]
    summary, table, *_ = show_architecture("sliding", "The KV cache")
    assert set(table["tokens held"]) == {7} and "✓" in summary  # window 8: transformers keeps 7


def test_live_section_runs_the_linear_attention_hybrid_generate_refuses():
    from kvviz.ui.memory.architectures import show_architecture

    summary, table, _, steps, attention = show_architecture("linear hybrid", "The KV cache")
    assert "Attention recorded on layer 3 (full attention) and on none of layers 0, 1, 2" in summary
    assert "the same every time" in summary and "captured logits within" in summary
    assert "recorded on layers 3; none on layers 0, 1, 2 (no attention); layer 3 shown" in attention.layout.title.text
    rows = attention.data[0].z  # the full-attention layer's prompt rows, mean over heads: each sums to 1
    assert len(rows) == 12 and all(abs(sum(r) - 1) < 1e-5 for r in rows)
    assert list(table["state bytes (measured / formula)"]) == ["2,048 / 2,048"] * 3 + ["0 / 0"]
    flat = [t.y for t in steps.data[0:6:2]]  # the three linear layers' measured bytes, step by step
    assert all(set(y) == {2048} for y in flat) and steps.data[6].y[-1] > steps.data[6].y[0]


@pytest.mark.parametrize(
    "kind, prompt, message",
    [
        ("Mamba", "hi", "Pick one of the architectures"),
        ("GQA", "   ", "Type a short prompt"),
        ("GQA", "é" * 101, "at most 200 bytes"),
        ("GQA", None, "Type a short prompt"),
    ],
)
def test_live_architecture_bad_input_is_a_readable_error(kind, prompt, message):
    from kvviz.ui.memory.architectures import show_architecture

    with pytest.raises(gr.Error, match=message):
        show_architecture(kind, prompt)


@pytest.mark.parametrize("kv_dtype, group", [("int4", 32), ("int2", 64), ("int4", 128)])
def test_table_and_every_chart_count_the_scales_the_summary_counts(ctx, kv_dtype, group):
    """A low-bit cache with a scale/zero group: the table and the size, capacity, decode and budget charts
    show the summary's bytes (each read from its own figure), not the dtype's bytes without the scales."""
    out = calc(ctx, kv_dtype=kv_dtype, group_size=group, context=8192, batch=162, compare=())
    text = out.summary.replace("**", "")
    per_token = int(re.search(r"Per token \(every layer\): ([\d,]+) B", text)[1].replace(",", ""))
    per_seq = int(re.search(r"Per sequence at 8,192 tokens: ([\d,]+) B", text)[1].replace(",", ""))
    total = int(re.search(r"All GPUs together for a batch of 162 at TP 8[^:]*: ([\d,]+) B", text)[1].replace(",", ""))
    sequences = int(re.search(r"→ ([\d,]+) sequences at 8,192 tokens", text)[1].replace(",", ""))
    kv_ms = float(re.search(r"KV ([\d.]+) ms = ", text)[1])
    bare = calc(ctx, kv_dtype=kv_dtype, group_size=0, context=8192, batch=162, compare=()).summary
    assert f"{per_token:,} B" not in bare  # the scales change the bytes: the checks below can tell
    mine = out.table[out.table["Attention"].str.endswith("(this model)")].iloc[0]
    assert (mine["KV per token"], mine["8,192-token sequence"]) == (format_bytes(per_token), format_bytes(per_seq))
    assert f"per {group}" in mine["per-token arithmetic"]
    size = out.size.data[0]
    assert size.y[list(size.x).index(8192)] * 2**30 == pytest.approx(per_seq)
    assert f"+fp16 scale/zero per {group}" in out.size.layout.title.text
    at = [str(x) for x in out.capacity.data[0].x].index("8,192")
    assert int(out.capacity.data[0].text[at]) == sequences
    dec = out.decode.data[1]
    i = [x.split("<br>")[0] for x in dec.x].index("8,192")
    assert f"{dec.y[i]:.2f}" == f"{kv_ms:.2f}" and dec.customdata[i] == format_bytes(total)
    assert f">{format_bytes(total)} of " in out.gauge.data[0].title.text
