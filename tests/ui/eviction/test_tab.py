"""Eviction tab handlers, in-process on the real model: validation, the views, the tab and its /evict endpoint."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.settings import Settings
from kvviz.ui.eviction import tab
from kvviz.ui.serving.context import AppContext

CONTEXT = "The library opens at nine. The code for the locker is 3390. The library closes at six."
QUESTION = "Question: What is the code for the locker?"


@pytest.fixture(scope="module")
def ctx(lm):
    return AppContext(lm=lm, settings=Settings(max_new_tokens=64))


def req(ctx, **kw):
    args = dict(
        context=CONTEXT,
        question=QUESTION,
        chat=True,
        policy_name="h2o",
        mode="tokens",
        budget=12,
        ratio=0.5,
        max_new=4,
        params={"heavy_fraction": 0.5},
        compress=tab.COMPRESS_QUESTION,
    )
    args.update(kw)
    return tab.check_request(ctx, *args.values())


def test_a_checked_request_has_everything_a_run_needs(ctx):
    r = req(ctx)
    assert r.policy.name == "h2o" and r.budget == 12 and r.ratio is None
    assert r.n_compress == len(r.ids)
    only_context = req(ctx, compress=tab.COMPRESS_CONTEXT)
    assert only_context.n_compress < len(only_context.ids)
    by_ratio = req(ctx, mode="ratio", ratio=0.75)
    assert by_ratio.budget is None and by_ratio.ratio == 0.75


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"context": "   "}, "empty"),
        ({"budget": 2.5}, "whole number"),
        ({"budget": 0}, "Budget"),
        ({"mode": "ratio", "ratio": 1.5}, r"Compression ratio must be a number in \[0, 0.99\]; got 1.5"),
        ({"mode": "ratio", "ratio": -0.2}, r"Compression ratio must be a number in \[0, 0.99\]; got -0.2"),
        (
            {
                "mode": "ratio",
                "ratio": 0.99,
                "policy_name": "streaming_llm",
                "params": {"sinks": 4, "reposition": False},
            },
            "Compression ratio 0.99 evicts too much .* Lower the compression ratio",
        ),
        ({"max_new": 10_000}, "Max new tokens"),
        ({"max_new": -5}, "Max new tokens must be between 1"),
        ({"policy_name": "lru"}, "Pick a policy"),
        ({"policy_name": "snapkv", "params": {"window_size": 64, "kernel_size": 4, "pooling": "avg"}}, "odd"),
        ({"policy_name": "snapkv", "params": {"window_size": 64, "kernel_size": 5, "pooling": "avg"}}, "window"),
        ({"policy_name": "streaming_llm", "params": {"sinks": 12, "reposition": False}}, "sinks"),
        ({"question": "", "compress": tab.COMPRESS_CONTEXT}, "needs a question"),
    ],
)
def test_bad_input_is_a_readable_error(ctx, change, message):
    with pytest.raises(gr.Error, match=message):
        req(ctx, **change)


@pytest.mark.slow
def test_views_draw_every_output_and_say_the_position_mode(ctx):
    r = req(ctx)
    run = r.run(ctx.lm)
    drawn = tab.views(run, 29, 2, 99, "score")
    strip, kept, timeline, scores, slots = drawn.strip, drawn.kept_plot, drawn.time_plot, drawn.score_plot, drawn.slots
    assert len(strip) == len(run.tokens) - 1  # clamped to the last step: every fed token
    last = len(run.history) - 1
    assert f"after step {last} (budget: 12" in kept.layout.title.text and kept.data[0].z.shape[0] == 30
    assert "layer 29, KV head 2" in timeline.layout.title.text and timeline.data[0].z.shape[0] == len(run.history)
    assert "layer 29, KV head 2" in scores.layout.title.text and len(scores.data[0].x) == len(r.ids)
    assert len(slots) == 12
    text = tab.status_text(run, r.policy)
    assert "n_kept = 12" in text and "original RoPE positions" in text and "KiB" in text
    assert tab.views(None, 0, 0, 0) is None


def test_the_tab_builds_registers_its_inputs_and_the_evict_endpoint(ctx):
    with gr.Blocks() as demo:
        tab.build(ctx)
    for key in ("policy", "budget", "prompt", "question", "compress", "needle", "sinks"):
        assert f"eviction.{key}" in ctx.components
    for key in ("ratio", "max_new"):  # a slider would clamp −0.2 to 0 before the handler could refuse it
        box = ctx.components[f"eviction.{key}"]
        assert isinstance(box, gr.Number) and box.minimum is None and box.maximum is None
    params = [p["parameter_name"] for p in demo.get_api_info()["named_endpoints"]["/evict"]["parameters"]]
    assert params[:4] == ["prompt_text", "policy_name", "budget", "ratio"]
