"""Memory tab: the KV-cache calculator for any config, batch capacity, decode time, and the live cache check.

Handlers turn raw widget values into checked numbers (``gr.Error`` with what to fix) and call
:mod:`kvviz.memory.estimate`, :mod:`kvviz.memory.capacity` and :mod:`kvviz.figures.memory`; no arithmetic here.
The named endpoint ``/memory`` returns the same dict as ``python -m kvviz memory --json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
from gradio.components import Component

from kvviz.figures import memory as fig
from kvviz.memory.estimate import KV_DTYPES, live_cache_bytes_formula, resolve_kv_dtype
from kvviz.memory.layout import preset_names
from kvviz.memory.report import MemoryRequest, report
from kvviz.ui.memory import architectures as memory_architectures
from kvviz.ui.memory import startup as memory_engine
from kvviz.ui.memory.calculator import GPUS, Drawn, Form, _number, calculate
from kvviz.ui.memory.sources import SOURCES, resolve_layout
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.model_job import endpoint
from kvviz.ui.serving.sessions import user_errors
from kvviz.units import format_bytes

CUSTOM_GPU = "custom"
PASTE_HINT = '{"model_type": "llama", "num_hidden_layers": 32, ...}'
NUMBER_FIELDS = ("context", "batch", "tp", "gpus", "kv_producing")  # recalculated on Enter
# the widgets other views set by name (the Learn tab's show-mes, deep links): "memory.<field>"
DEEP_LINKED = ("source", "preset", "context", "batch", "kv_dtype", "tp", "gpu", "gpus")


def live_comparison(ctx: AppContext, trace) -> str:
    """The loaded model's measured cache bytes (latest Generate run) next to the formula's."""
    if trace is None or not trace.steps:
        return (
            f"**Live cache of {ctx.info.name}**: run **Generate** first; its cache's measured bytes will "
            "appear here next to the formula's."
        )
    last = trace.steps[-1]
    seen = trace.n_fed
    f = live_cache_bytes_formula(ctx.lm.config, seen, trace.model.bytes_per_element)
    ok = f["layer_bytes"] == list(last.layer_bytes)
    verdict = "they agree, layer by layer ✓" if ok else "**they differ** ✗ (please report this)"
    return (
        f"**Live cache of {ctx.info.name}** after the last Generate run ({seen:,} tokens fed, "
        f"{trace.model.dtype}): measured from the tensors **{last.cache_bytes:,} B = "
        f"{format_bytes(last.cache_bytes)}**; the formula gives **{f['total']:,} B = "
        f"{format_bytes(f['total'])}** — {verdict}."
    )


def api_memory(
    ctx: AppContext,
    config: str,
    context: int = 8192,
    batch: int = 1,
    kv_dtype: str = "bf16",
    tp: int | None = None,
    gpus: int = 1,
    gpu_mem_gb: float | None = None,
    reserve: float = 0.1,
    weights_gb: float | None = None,
    bandwidth_tbps: float | None = None,
    group_size: int | None = None,
) -> dict:
    """KV-cache size, capacity and decode time: the JSON of ``python -m kvviz memory --json``.

    Args:
        config: a model preset name (e.g. Llama-3-70B), "loaded" for the served model, or a config.json's text.
        context: tokens per sequence, a whole number.
        batch: sequences held at once, a whole number.
        kv_dtype: the cache's storage type: fp32, bf16, fp16, fp8, int8, int4 or int2.
        tp: tensor-parallel degree, a whole number (omitted: gpus).
        gpus: number of GPUs, a whole number.
        gpu_mem_gb: memory per GPU, in decimal GB (omitted: no capacity figures).
        reserve: fraction of each GPU's memory kept for activations and workspace, from 0 to 1.
        weights_gb: model weights, in decimal GB (omitted: the preset's parameters in bf16).
        bandwidth_tbps: memory bandwidth per GPU, in TB/s (omitted: no decode-time figures).
        group_size: low-bit KV: elements per fp16 scale and zero point, a whole number (omitted: none counted).

    Returns:
        Bytes per token and in all, the batch that fits, and decode time split into weights and KV (sizes in bytes).
    """
    text = (config or "").strip()
    if text.startswith("{"):
        layout = resolve_layout(ctx, "Paste JSON", "", text, None)
    elif text.lower() == "loaded":
        layout = resolve_layout(ctx, "Loaded model", "", "", None)
    elif text.lower() in {n.lower() for n in preset_names()}:
        layout = resolve_layout(ctx, "Preset", next(n for n in preset_names() if n.lower() == text.lower()), "", None)
    else:
        raise UserError(f"config must be a preset ({', '.join(preset_names())}), 'loaded', or config JSON text.")
    if weights_gb is None and text.lower() == "loaded":
        weights_gb = ctx.info.weight_bytes / 1e9
    with user_errors():
        group = None if group_size in (0, None) else _number("group_size", group_size)
        request = MemoryRequest(
            layout,
            context=_number("context", context, blank=8192),
            batch=_number("batch", batch, blank=1),
            kv_dtype=resolve_kv_dtype(kv_dtype, group),
            tp=_number("tp", tp),
            gpus=_number("gpus", gpus, blank=1),
            gpu_mem_gb=_number("gpu_mem_gb", gpu_mem_gb),
            reserve=_number("reserve", reserve, blank=0.1),
            weights_gb=_number("weights_gb", weights_gb),
            bandwidth_tbps=_number("bandwidth_tbps", bandwidth_tbps),
        )
        return report(request).to_json()


# ---- the page ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Views:
    """The tab's components by name: ``inputs`` under :class:`Form`'s field names, ``outputs`` under
    :class:`Drawn`'s, so a handler reads and answers by name and a new field is declared once."""

    inputs: dict[str, Component]
    outputs: dict[str, Component]
    button: gr.Button
    live: gr.Markdown

    def form(self, values: dict[Component, Any]) -> Form:
        """The widgets' values (Gradio's dict of a set of inputs) as the form."""
        return Form(**{name: values[c] for name, c in self.inputs.items()})

    def shown(self, drawn: Drawn) -> dict[Component, Any]:
        return {c: getattr(drawn, name) for name, c in self.outputs.items()}


def build(ctx: AppContext) -> None:
    """Build the Memory tab inside the caller's ``gr.Tab``: its layout, drawn with the opening example, then
    :func:`wire`. The arithmetic is :func:`check`, :func:`draw` and :mod:`kvviz.memory`."""
    f = Form()
    gr.Markdown(
        "Size the KV cache of any model from its config: per token, per sequence and per batch, how many "
        "sequences fit on your GPUs, and how long each decode step must take to read it all."
    )
    w: dict[str, Component] = {}
    with gr.Row():
        with gr.Column(scale=2):
            w["source"] = gr.Radio(SOURCES, value=f.source, label="Model")
            w["preset"] = gr.Dropdown(preset_names(), value=f.preset, label="Preset")
            w["pasted"] = gr.Textbox(
                label="config.json (JSON only)", lines=8, visible=False, placeholder=PASTE_HINT, value=f.pasted
            )
            w["upload"] = gr.File(label="config.json", file_types=[".json"], type="filepath", visible=False)
        with gr.Column(scale=2):
            w["context"] = gr.Number(value=f.context, precision=0, label="Context (tokens per sequence)")
            w["batch"] = gr.Number(value=f.batch, precision=0, label="Batch (sequences)")
            w["kv_dtype"] = gr.Dropdown(list(KV_DTYPES), value=f.kv_dtype, label="KV dtype")
            w["group_size"] = gr.Number(
                value=f.group_size, precision=0, label="Scale/zero group size (0 = none; low-bit only)"
            )
            w["tp"] = gr.Number(value=f.tp, precision=0, label="Tensor parallelism (0 = all the GPUs)")
            w["kv_producing"] = gr.Number(
                value=f.kv_producing, precision=0, label="KV-producing layers (0 = as the config says; the rest share)"
            )
        with gr.Column(scale=2):
            w["gpu"] = gr.Dropdown([*GPUS, CUSTOM_GPU], value=f.gpu, label="GPU")
            w["gpus"] = gr.Number(value=f.gpus, precision=0, label="Number of GPUs")
            w["gpu_mem_gb"] = gr.Number(value=f.gpu_mem_gb, label="Memory per GPU (GB, decimal)")
            w["bandwidth_tbps"] = gr.Number(value=f.bandwidth_tbps, label="Bandwidth per GPU (TB/s)")
            w["reserve"] = gr.Slider(0.0, 0.5, value=f.reserve, step=0.01, label="Reserve for activations/workspace")
            w["weights_gb"] = gr.Number(
                value=f.weights_gb, label="Weights (GB; 0 = the preset's stated figure, else parameters × 2 B)"
            )
    w["compare"] = gr.CheckboxGroup(preset_names(), value=list(f.compare), label="Compare with (size vs context chart)")
    button = gr.Button("Calculate", variant="primary", elem_id="memory-calc")
    first = calculate(ctx, f)  # the tab opens drawn: the chapter's 8 × H100 example
    o: dict[str, Component] = {"summary": gr.Markdown(first.summary, elem_id="memory-summary")}
    live = gr.Markdown(live_comparison(ctx, None), elem_id="memory-live")
    o["formula"] = gr.Markdown(first.formula, elem_id="memory-formula")
    gr.Markdown(fig.CAPTIONS["formula"], elem_classes="caption")
    o["table"] = gr.Dataframe(
        first.table, label="MHA / GQA / MQA / MLA for this model's layers", interactive=False, elem_id="memory-table"
    )
    gr.Markdown(fig.CAPTIONS["table"], elem_classes="caption")
    o["size"] = gr.Plot(first.size, label="KV cache vs context", elem_id="memory-size")
    gr.Markdown(fig.CAPTIONS["size"], elem_classes="caption")
    with gr.Row():
        o["capacity"] = captioned_plot("Batch capacity", "memory-capacity", fig.CAPTIONS["capacity"], first.capacity)
        o["decode"] = captioned_plot("Decode step", "memory-decode", fig.CAPTIONS["decode"], first.decode)
    o["gauge"] = gr.Plot(first.gauge, label="KV budget", elem_id="memory-gauge-budget")
    gr.Markdown(fig.CAPTIONS["gauge"], elem_classes="caption")
    wire(ctx, Views(w, o, button, live))
    memory_architectures.build(ctx)
    memory_engine.build(ctx)


# recalculated at once on these widgets' events (the numbers on Enter, the choices on change)
RECALCULATE_ON = {"change": ("source", "preset", "kv_dtype", "gpu", "compare"), "submit": NUMBER_FIELDS}


def wire(ctx: AppContext, views: Views) -> None:
    """The tab's events: the source shows its input, a GPU fills its numbers, the calculator recalculates."""
    w = views.inputs
    ctx.components.update({f"memory.{name}": w[name] for name in DEEP_LINKED} | {"memory.button": views.button})

    def show_source(choice):
        return {
            w["preset"]: gr.update(visible=choice == "Preset"),
            w["pasted"]: gr.update(visible=choice == "Paste JSON"),
            w["upload"]: gr.update(visible=choice == "Upload config.json"),
        }

    def pick_gpu(name):
        if name in GPUS:
            return {w["gpu_mem_gb"]: GPUS[name].memory_gb, w["bandwidth_tbps"]: GPUS[name].bandwidth_tbps}
        return gr.skip()  # "Custom": the typed numbers stay (Gradio refuses an empty dict)

    w["source"].change(show_source, w["source"], [w["preset"], w["pasted"], w["upload"]], queue=False, api_name=False)
    w["gpu"].change(pick_gpu, w["gpu"], [w["gpu_mem_gb"], w["bandwidth_tbps"]], queue=False, api_name=False)

    def recalculate(values: dict):
        return views.shown(calculate(ctx, views.form(values)))

    outputs = list(views.outputs.values())
    triggers = [views.button.click] + [getattr(w[n], kind) for kind, names in RECALCULATE_ON.items() for n in names]
    # arithmetic on bounded inputs (kvviz.limits): quick, so it never waits in a queue
    calculated = gr.on(triggers, recalculate, set(w.values()), outputs, api_name=False, concurrency_limit=None)
    clear_on_refusal(calculated, outputs)
    names = list(w)

    def answer(request, *values):
        """A show-me's calculator outputs in its own event (positional: the show-me's wiring lists them)."""
        shown = views.shown(calculate(ctx, Form(**dict(zip(names, values)))))
        return [shown[c] for c in outputs]

    ctx.answers["memory.button"] = ShowMeAnswer(list(w.values()), outputs, answer)
    if ctx.trace_state is not None:
        ctx.on_trace(lambda trace: live_comparison(ctx, trace), [ctx.trace_state], [views.live])

    gr.api(endpoint(ctx, api_memory), api_name="memory", concurrency_limit=None)
