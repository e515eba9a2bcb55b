"""Memory tab section: the start-up log of a paged engine (vLLM), each number linked to its formula.

For a preset or the loaded model, GPUs, tensor parallelism, KV dtype, block size and max_model_len,
:func:`kvviz.memory.paged.startup` computes what the engine prints; :mod:`kvviz.figures.paged`
renders it. This module only checks inputs and wires events.
"""

from __future__ import annotations

from dataclasses import replace

import gradio as gr

from kvviz.figures import paged as fig
from kvviz.limits import calculator_number
from kvviz.memory.capacity import gpu_presets, weight_bytes
from kvviz.memory.estimate import KV_DTYPES
from kvviz.memory.layout import cache_layout, load_preset, preset_names
from kvviz.memory.paged import DEFAULT_MAX_NUM_BATCHED_TOKENS, startup
from kvviz.ui.page.widgets import captioned_plot
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.sessions import user_errors

LOADED = "Loaded model"
BLOCK_SIZES = [8, 16, 32, 64, 128]


def _number(name: str, value, label: str, blank=None):
    if value is None or (isinstance(value, str) and not value.strip()):
        return blank
    with user_errors():
        return calculator_number(name, value, label)


def _whole_or_default(value, label: str):
    """A positive whole number, or None (the default) when blank or 0."""
    if value in (None, "", 0, 0.0):
        return None
    with user_errors():
        return int(calculator_number("context", value, label))  # the context bound: 1 … 134M tokens


def startup_view(
    ctx: AppContext,
    model,
    gpu_name,
    gpus,
    gpu_mem_gb,
    tp,
    kv_dtype,
    block_size,
    max_model_len,
    batched,
    reserve,
    weights_gb,
):
    """(log with formulas, layer-group table, concurrency chart) — or a ⚠ line when the engine cannot start."""
    with user_errors():
        if model == LOADED:
            layout = replace(cache_layout(ctx.lm.config), name=ctx.info.name, num_parameters=ctx.info.param_count)
        elif model in preset_names():
            layout = cache_layout(load_preset(model))
        else:
            raise ValueError(f"Pick a model: {LOADED} or one of {', '.join(preset_names())}.")
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"KV dtype must be one of {', '.join(KV_DTYPES)}.")
    n_gpus = _number("gpus", gpus, "Number of GPUs", blank=1)
    mem = _number("gpu_mem_gb", gpu_mem_gb, "Memory per GPU (GB)")
    if mem is None:
        preset = gpu_presets().get(gpu_name)
        if preset is None:
            raise gr.Error("Give the memory per GPU (GB) or pick a GPU.")
        mem = preset.memory_gb
    tp_n = None if tp in (None, "", 0, 0.0) else _number("tp", tp, "Tensor parallelism")
    keep = _number("reserve", reserve, "Reserve", blank=0.1)
    w = None if weights_gb in (None, "", 0, 0.0) else _number("weights_gb", weights_gb, "Weights (GB)")
    model_len = _whole_or_default(max_model_len, "max_model_len")
    tokens = _whole_or_default(batched, "max_num_batched_tokens") or DEFAULT_MAX_NUM_BATCHED_TOKENS
    try:  # the engine may legitimately not start (weights too big, TP that does not divide): say why
        if w is not None:
            wbytes = round(w * 1e9)
        elif model == LOADED:
            wbytes = ctx.info.weight_bytes
        else:
            wbytes = weight_bytes(layout.num_parameters, "bf16")
        s = startup(
            layout,
            gpus=n_gpus,
            gpu_mem_gb=mem,
            weight_bytes=wbytes,
            reserve=keep,
            tp=tp_n,
            kv_dtype=kv_dtype,
            block_size=block_size,
            max_model_len=model_len,
            max_num_batched_tokens=tokens,
        )
    except ValueError as exc:
        return f"⚠ {exc}", None, None
    return fig.startup_markdown(s), fig.groups_table(s), fig.concurrency_chart(s)


def build(ctx: AppContext) -> None:
    """The section, at the end of the Memory tab."""
    gpus_by_name = gpu_presets()
    first = next(iter(gpus_by_name))
    gr.Markdown(
        "### The engine's start-up log, explained\nA paged engine such as vLLM allocates the KV cache as one "
        'pool of blocks when it starts and prints how much fits — the chapter: *"The startup log tells you '
        'how many tokens fit — read it."* Below are the lines it would print for your setup, each number '
        "with the formula behind it; hybrid models (sliding + full layers) are counted per layer group."
    )
    with gr.Row():
        with gr.Column():
            model = gr.Dropdown([LOADED, *preset_names()], value="Llama-3-70B", label="Model", elem_id="engine-model")
            kv_dtype = gr.Dropdown(list(KV_DTYPES), value="bf16", label="KV dtype", elem_id="engine-kv-dtype")
            block = gr.Dropdown(BLOCK_SIZES, value=16, label="Block size (tokens)", elem_id="engine-block")
        with gr.Column():
            gpu = gr.Dropdown(list(gpus_by_name), value=first, label="GPU", elem_id="engine-gpu")
            gpus = gr.Number(8, precision=0, label="Number of GPUs", elem_id="engine-gpus")
            mem = gr.Number(gpus_by_name[first].memory_gb, label="Memory per GPU (GB)", elem_id="engine-mem")
            tp = gr.Number(0, precision=0, label="Tensor parallelism (0 = all the GPUs)", elem_id="engine-tp")
        with gr.Column():
            model_len = gr.Number(
                8192, precision=0, label="max_model_len (tokens; 0 = the config's context)", elem_id="engine-max-len"
            )
            batched = gr.Number(
                DEFAULT_MAX_NUM_BATCHED_TOKENS,
                precision=0,
                label="max_num_batched_tokens (sliding layers' extra blocks)",
                elem_id="engine-batched",
            )
            reserve = gr.Slider(
                0.0,
                0.5,
                value=0.1,
                step=0.01,
                label="Reserve (1 − gpu_memory_utilization, activations)",
                elem_id="engine-reserve",
            )
            weights = gr.Number(140, label="Weights (GB; 0 = parameters × 2 B)", elem_id="engine-weights")
    inputs = [model, gpu, gpus, mem, tp, kv_dtype, block, model_len, batched, reserve, weights]
    first_view = startup_view(
        ctx,
        "Llama-3-70B",
        first,
        8,
        gpus_by_name[first].memory_gb,
        0,
        "bf16",
        16,
        8192,
        DEFAULT_MAX_NUM_BATCHED_TOKENS,
        0.1,
        140,
    )  # the chapter's 8 × H100 example
    log = gr.Markdown(first_view[0], elem_id="engine-log")
    gr.Markdown(fig.CAPTIONS["log"], elem_classes="caption")
    groups = gr.Dataframe(first_view[1], label="Layer groups", interactive=False, elem_id="engine-groups", wrap=True)
    gr.Markdown(fig.CAPTIONS["groups"], elem_classes="caption")
    chart = captioned_plot(
        "Maximum concurrency vs max_model_len", "engine-concurrency", fig.CAPTIONS["concurrency"], first_view[2]
    )
    ctx.components.update({"memory.engine_model": model, "memory.engine_block": block})

    def pick_gpu(name):
        return gpus_by_name[name].memory_gb if name in gpus_by_name else gr.skip()

    def pick_model(name):
        return 140 if name == "Llama-3-70B" else 0  # the chapter's 140 GB; others: parameters × 2 B

    def show(*values):
        return startup_view(ctx, *values)

    outputs = [log, groups, chart]
    gpu.change(pick_gpu, gpu, mem, queue=False, api_name=False).then(show, inputs, outputs, api_name=False)
    model.change(pick_model, model, weights, queue=False, api_name=False).then(show, inputs, outputs, api_name=False)
    gr.on(
        [
            kv_dtype.change,
            block.change,
            reserve.change,
            gpus.submit,
            tp.submit,
            mem.submit,
            model_len.submit,
            batched.submit,
            weights.submit,
        ],
        show,
        inputs,
        outputs,
        api_name=False,
        concurrency_limit=None,
    )
