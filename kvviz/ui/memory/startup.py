"""Memory tab section: the start-up log of a paged engine (vLLM), each number linked to its formula.

For a preset or the loaded model, GPUs, tensor parallelism, KV dtype, block size and max_model_len,
:func:`kvviz.memory.paged.startup` computes what the engine prints; :mod:`kvviz.figures.paged`
renders it. This module only checks inputs and wires events.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import gradio as gr
import pandas as pd
import plotly.graph_objects as go
from gradio.components import Component

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


@dataclass(frozen=True)
class EngineForm:
    """The section's inputs by name, raw as its widgets hold them; the defaults are the chapter's 8 × H100
    example it opens on."""

    model: str = "Llama-3-70B"
    gpu_name: str = field(default_factory=lambda: next(iter(gpu_presets())))
    gpus: Any = 8
    gpu_mem_gb: Any = None  # None: the picked GPU's memory
    tp: Any = 0
    kv_dtype: str = "bf16"
    block_size: Any = 16
    max_model_len: Any = 8192
    batched: Any = DEFAULT_MAX_NUM_BATCHED_TOKENS
    reserve: Any = 0.1
    weights_gb: Any = 140


@dataclass(frozen=True)
class EngineLog:
    """What the section shows: the log with its formulas, the layer-group table and the concurrency chart
    (the table and chart None, and the log a ⚠ line, when the engine cannot start)."""

    text: str
    groups: pd.DataFrame | None
    chart: go.Figure | None


@dataclass(frozen=True)
class EngineViews:
    """The section's components by name: ``inputs`` under :class:`EngineForm`'s field names, and the outputs."""

    inputs: dict[str, Component]
    log: Component
    groups: Component
    chart: Component

    def form(self, values: dict) -> EngineForm:
        """The request, built once from Gradio's ``{component: value}`` of the inputs."""
        return EngineForm(**{k: values[c] for k, c in self.inputs.items() if c in values})

    def shown(self, out: EngineLog) -> dict:
        return {self.log: out.text, self.groups: out.groups, self.chart: out.chart}


def startup_view(ctx: AppContext, f: EngineForm) -> EngineLog:
    """The log, table and chart for ``f`` — or a ⚠ line when the engine cannot start."""
    model, gpu_name, kv_dtype, block_size = f.model, f.gpu_name, f.kv_dtype, f.block_size
    gpus, gpu_mem_gb, tp, reserve, weights_gb = f.gpus, f.gpu_mem_gb, f.tp, f.reserve, f.weights_gb
    max_model_len, batched = f.max_model_len, f.batched
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
        return EngineLog(f"⚠ {exc}", None, None)
    return EngineLog(fig.startup_markdown(s), fig.groups_table(s), fig.concurrency_chart(s))


def _inputs(first: EngineForm) -> dict[str, Component]:
    """The section's inputs, laid out in three columns, by :class:`EngineForm`'s field names."""
    presets = gpu_presets()
    with gr.Row():
        with gr.Column():
            model = gr.Dropdown([LOADED, *preset_names()], value=first.model, label="Model", elem_id="engine-model")
            kv_dtype = gr.Dropdown(list(KV_DTYPES), value=first.kv_dtype, label="KV dtype", elem_id="engine-kv-dtype")
            block = gr.Dropdown(
                BLOCK_SIZES, value=first.block_size, label="Block size (tokens)", elem_id="engine-block"
            )
        with gr.Column():
            gpu = gr.Dropdown(list(presets), value=first.gpu_name, label="GPU", elem_id="engine-gpu")
            gpus = gr.Number(first.gpus, precision=0, label="Number of GPUs", elem_id="engine-gpus")
            mem = gr.Number(presets[first.gpu_name].memory_gb, label="Memory per GPU (GB)", elem_id="engine-mem")
            tp = gr.Number(first.tp, precision=0, label="Tensor parallelism (0 = all the GPUs)", elem_id="engine-tp")
        with gr.Column():
            model_len = gr.Number(
                first.max_model_len,
                precision=0,
                label="max_model_len (tokens; 0 = the config's context)",
                elem_id="engine-max-len",
            )
            batched = gr.Number(
                first.batched,
                precision=0,
                label="max_num_batched_tokens (sliding layers' extra blocks)",
                elem_id="engine-batched",
            )
            reserve = gr.Slider(
                0.0,
                0.5,
                value=first.reserve,
                step=0.01,
                label="Reserve (1 − gpu_memory_utilization, activations)",
                elem_id="engine-reserve",
            )
            weights = gr.Number(first.weights_gb, label="Weights (GB; 0 = parameters × 2 B)", elem_id="engine-weights")
    return dict(
        model=model,
        gpu_name=gpu,
        gpus=gpus,
        gpu_mem_gb=mem,
        tp=tp,
        kv_dtype=kv_dtype,
        block_size=block,
        max_model_len=model_len,
        batched=batched,
        reserve=reserve,
        weights_gb=weights,
    )


def build(ctx: AppContext) -> None:
    """The section, at the end of the Memory tab."""
    gpus_by_name = gpu_presets()
    gr.Markdown(
        "### The engine's start-up log, explained\nA paged engine such as vLLM allocates the KV cache as one "
        'pool of blocks when it starts and prints how much fits — the chapter: *"The startup log tells you '
        'how many tokens fit — read it."* Below are the lines it would print for your setup, each number '
        "with the formula behind it; hybrid models (sliding + full layers) are counted per layer group."
    )
    first = EngineForm()
    inputs = _inputs(first)
    opening = startup_view(ctx, first)  # the chapter's 8 × H100 example
    log = gr.Markdown(opening.text, elem_id="engine-log")
    gr.Markdown(fig.CAPTIONS["log"], elem_classes="caption")
    groups = gr.Dataframe(opening.groups, label="Layer groups", interactive=False, elem_id="engine-groups", wrap=True)
    gr.Markdown(fig.CAPTIONS["groups"], elem_classes="caption")
    chart = captioned_plot(
        "Maximum concurrency vs max_model_len", "engine-concurrency", fig.CAPTIONS["concurrency"], opening.chart
    )
    v = EngineViews(inputs, log, groups, chart)
    ctx.components.update({"memory.engine_model": inputs["model"], "memory.engine_block": inputs["block_size"]})

    def pick_gpu(name):
        return gpus_by_name[name].memory_gb if name in gpus_by_name else gr.skip()

    def pick_model(name):
        return 140 if name == "Llama-3-70B" else 0  # the chapter's 140 GB; others: parameters × 2 B

    def show(values: dict) -> dict:
        return v.shown(startup_view(ctx, v.form(values)))

    named, outputs = set(inputs.values()), [log, groups, chart]
    gpu, model = inputs["gpu_name"], inputs["model"]
    gpu.change(pick_gpu, gpu, inputs["gpu_mem_gb"], queue=False, api_name=False).then(
        show, named, outputs, api_name=False
    )
    model.change(pick_model, model, inputs["weights_gb"], queue=False, api_name=False).then(
        show, named, outputs, api_name=False
    )
    changes = [inputs[k].change for k in ("kv_dtype", "block_size", "reserve")]
    submits = [inputs[k].submit for k in ("gpus", "tp", "gpu_mem_gb", "max_model_len", "batched", "weights_gb")]
    gr.on([*changes, *submits], show, named, outputs, api_name=False, concurrency_limit=None)
