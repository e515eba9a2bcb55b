"""Memory tab: the KV-cache calculator for any config, batch capacity, decode time, and the live cache check.

Handlers turn raw widget values into checked numbers (``gr.Error`` with what to fix) and call
:mod:`kvviz.memory.estimate`, :mod:`kvviz.memory.capacity` and :mod:`kvviz.figures.memory`; no arithmetic here.
The named endpoint ``/memory`` returns the same dict as ``python -m kvviz memory --json``.
"""

from __future__ import annotations

import gradio as gr

from kvviz.figures import memory as fig
from kvviz.limits import calculator_number
from kvviz.memory.capacity import gpu_presets
from kvviz.memory.estimate import KV_DTYPES, estimate, live_cache_bytes_formula
from kvviz.memory.layout import cache_layout, head_dim_note, load_preset, preset_names, stated_weights_gb
from kvviz.memory.report import report, summary
from kvviz.memory.sharing import share_kv
from kvviz.ui.memory import architectures as memory_architectures
from kvviz.ui.memory import startup as memory_engine
from kvviz.ui.memory.sources import SOURCES, resolve_layout
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.model_job import endpoint
from kvviz.ui.serving.sessions import user_errors
from kvviz.units import format_bytes

CUSTOM_GPU = "custom"
COMPARE_DEFAULT = ["Llama-3-8B", "Mistral-7B-v0.1", "gemma-2-9b", "gpt-oss-20b", "DeepSeek-V3"]


# ---- validation -----------------------------------------------------------------------------------


def _number(name: str, value, label: str | None = None, blank=None):
    """A calculator input checked against its bound in :mod:`kvviz.limits` (``blank`` when left empty)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return blank
    with user_errors():  # refuses NaN, infinities, fractions of counts, text and out-of-range values
        return calculator_number(name, value, label)


# ---- what the page shows --------------------------------------------------------------------------
def _contexts(context: int, lo: int = 128) -> list[int]:
    top = max(131_072, 1 << max(context - 1, 1).bit_length())
    return sorted({2**k for k in range(lo.bit_length() - 1, top.bit_length())} | {context} - {0})


def calculate(
    ctx: AppContext,
    source,
    preset,
    pasted,
    upload,
    context,
    batch,
    kv_dtype,
    group_size,
    tp,
    gpu_name,
    gpus,
    gpu_mem_gb,
    bandwidth_tbps,
    reserve,
    weights_gb,
    compare,
    kv_producing=0,
):
    """Every output of the tab for one set of inputs: summary, formula, table and four figures."""
    layout = resolve_layout(ctx, source, preset, pasted, upload)
    if kv_producing not in (0, 0.0, None, ""):  # 0: who stores K/V as the config says
        producing = _number("kv_producing", kv_producing, "KV-producing layers")
        with user_errors():
            layout = share_kv(layout, producing)
    context = _number("context", context, "Context", blank=8192)
    batch = _number("batch", batch, "Batch", blank=1)
    gpus = _number("gpus", gpus, "Number of GPUs", blank=1)
    tp = gpus if tp in (0, 0.0, None, "") else _number("tp", tp, "Tensor parallelism")  # 0 = all the GPUs
    group = 0 if group_size in (0, 0.0, None, "") else _number("group_size", group_size, "Group size")
    mem = _number("gpu_mem_gb", gpu_mem_gb, "GPU memory (GB)")
    bw = _number("bandwidth_tbps", bandwidth_tbps, "Bandwidth (TB/s)")
    weights = None if weights_gb in (0, 0.0) else _number("weights_gb", weights_gb, "Weights (GB)")
    notes = [n for n in [head_dim_note(layout)] if n]
    if source == "Loaded model" and weights is None:
        weights = ctx.info.weight_bytes / 1e9
    elif source == "Preset" and weights is None and stated_weights_gb(preset) is not None:
        weights = stated_weights_gb(preset)
        counted = (
            f" (parameters × 2 B would give {layout.num_parameters * 2 / 1e9:.1f} GB)" if layout.num_parameters else ""
        )
        notes.append(f"Weights: {weights:g} GB, the figure the source uses{counted}; type a number to override.")
    with user_errors():  # sizes first: bad input here is the user's to fix
        r = report(layout, context, batch, kv_dtype, tp, group or None)
        est = estimate(layout, context, batch, kv_dtype, tp, group or None)
        formula = fig.formula_markdown(layout, est)
        table = fig.comparison_table(layout, context, kv_dtype).drop(columns=["bytes_per_token", "bytes_per_sequence"])
        others = [cache_layout(load_preset(n)) for n in (compare or []) if n != layout.name]
        size = fig.size_vs_context([layout, *others], _contexts(context), kv_dtype)
    note = ""
    if layout.num_parameters is None and weights is None:
        note = "Give the weights in GB to see capacity and decode time (this config has no parameter count)."
    elif mem is not None or bw is not None:
        try:  # capacity may legitimately not exist (weights larger than the GPUs): say so, keep the sizes
            r = report(
                layout,
                context,
                batch,
                kv_dtype,
                tp,
                group or None,
                gpus,
                mem,
                _number("reserve", reserve, "Reserve", blank=0.1),
                weights,
                "bf16",
                bw,
            )
        except ValueError as exc:
            note = str(exc)
    cap = dec = gauge = kv_budget = None
    if r.capacity is not None:
        kv_budget = r.capacity.budget.kv_budget_bytes
        cap = fig.capacity_vs_context(layout, kv_budget, _contexts(context, 1024), kv_dtype, tp, context)
        gauge = fig.budget_gauge(r.estimate.total_bytes, kv_budget)
    if r.decode is not None:
        dec = fig.decode_time_vs_context(
            layout, r.decode.weight_bytes, batch, bw, gpus, _contexts(context, 1024), kv_dtype, tp, kv_budget, context
        )
    text = summary(r, markdown=True) + "".join(f"\n\nℹ {n}" for n in notes) + (f"\n\n⚠ {note}" if note else "")
    return text, formula, table, size, cap, dec, gauge


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
        return report(
            layout,
            _number("context", context, blank=8192),
            _number("batch", batch, blank=1),
            kv_dtype,
            _number("tp", tp),
            None if group_size in (0, None) else _number("group_size", group_size),
            _number("gpus", gpus, blank=1),
            _number("gpu_mem_gb", gpu_mem_gb),
            _number("reserve", reserve, blank=0.1),
            _number("weights_gb", weights_gb),
            "bf16",
            _number("bandwidth_tbps", bandwidth_tbps),
        ).to_json()


# ---- the page ----------------------------------------------------------------------------------------
def build(ctx: AppContext) -> None:
    """Build the Memory tab inside the caller's ``gr.Tab``.

    Length: long because it lays the calculator's widgets out in page order and wires each once; the arithmetic is
    :func:`calculate` and :mod:`kvviz.memory`."""
    gpus_by_name = gpu_presets()
    gr.Markdown(
        "Size the KV cache of any model from its config: per token, per sequence and per batch, how many "
        "sequences fit on your GPUs, and how long each decode step must take to read it all."
    )
    with gr.Row():
        with gr.Column(scale=2):
            source = gr.Radio(SOURCES, value="Preset", label="Model")
            preset = gr.Dropdown(preset_names(), value="Llama-3-70B", label="Preset")
            pasted = gr.Textbox(
                label="config.json (JSON only)",
                lines=8,
                visible=False,
                placeholder='{"model_type": "llama", "num_hidden_layers": 32, ...}',
            )
            upload = gr.File(label="config.json", file_types=[".json"], type="filepath", visible=False)
        with gr.Column(scale=2):
            context = gr.Number(value=8192, precision=0, label="Context (tokens per sequence)")
            batch = gr.Number(value=1, precision=0, label="Batch (sequences)")
            kv_dtype = gr.Dropdown(list(KV_DTYPES), value="bf16", label="KV dtype")
            group_size = gr.Number(value=0, precision=0, label="Scale/zero group size (0 = none; low-bit only)")
            tp = gr.Number(value=0, precision=0, label="Tensor parallelism (0 = all the GPUs)")
            kv_producing = gr.Number(
                value=0, precision=0, label="KV-producing layers (0 = as the config says; the rest share)"
            )
        with gr.Column(scale=2):
            first = next(iter(gpus_by_name))
            gpu = gr.Dropdown([*gpus_by_name, CUSTOM_GPU], value=first, label="GPU")
            gpus = gr.Number(value=8, precision=0, label="Number of GPUs")
            gpu_mem = gr.Number(value=gpus_by_name[first].memory_gb, label="Memory per GPU (GB, decimal)")
            bandwidth = gr.Number(value=gpus_by_name[first].bandwidth_tbps, label="Bandwidth per GPU (TB/s)")
            reserve = gr.Slider(0.0, 0.5, value=0.1, step=0.01, label="Reserve for activations/workspace")
            weights = gr.Number(value=0, label="Weights (GB; 0 = the preset's stated figure, else parameters × 2 B)")
    compare = gr.CheckboxGroup(preset_names(), value=COMPARE_DEFAULT, label="Compare with (size vs context chart)")
    button = gr.Button("Calculate", variant="primary", elem_id="memory-calc")
    first_values = calculate(
        ctx,
        "Preset",
        "Llama-3-70B",
        "",
        None,
        8192,
        1,
        "bf16",
        0,
        0,
        first,
        8,
        gpus_by_name[first].memory_gb,
        gpus_by_name[first].bandwidth_tbps,
        0.1,
        None,
        COMPARE_DEFAULT,
    )  # the chapter's 8 × H100 example
    summary_box = gr.Markdown(first_values[0], elem_id="memory-summary")
    live = gr.Markdown(live_comparison(ctx, None), elem_id="memory-live")
    formula = gr.Markdown(first_values[1], elem_id="memory-formula")
    gr.Markdown(fig.CAPTIONS["formula"], elem_classes="caption")
    table = gr.Dataframe(
        first_values[2],
        label="MHA / GQA / MQA / MLA for this model's layers",
        interactive=False,
        elem_id="memory-table",
    )
    gr.Markdown(fig.CAPTIONS["table"], elem_classes="caption")
    size = gr.Plot(first_values[3], label="KV cache vs context", elem_id="memory-size")
    gr.Markdown(fig.CAPTIONS["size"], elem_classes="caption")
    with gr.Row():
        capacity = captioned_plot("Batch capacity", "memory-capacity", fig.CAPTIONS["capacity"], first_values[4])
        decode = captioned_plot("Decode step", "memory-decode", fig.CAPTIONS["decode"], first_values[5])
    gauge = gr.Plot(first_values[6], label="KV budget", elem_id="memory-gauge-budget")
    gr.Markdown(fig.CAPTIONS["gauge"], elem_classes="caption")

    ctx.components.update(
        {
            "memory.source": source,
            "memory.preset": preset,
            "memory.context": context,
            "memory.batch": batch,
            "memory.kv_dtype": kv_dtype,
            "memory.tp": tp,
            "memory.gpu": gpu,
            "memory.gpus": gpus,
            "memory.button": button,
        }
    )

    def show_source(choice):
        return (
            gr.update(visible=choice == "Preset"),
            gr.update(visible=choice == "Paste JSON"),
            gr.update(visible=choice == "Upload config.json"),
        )

    def pick_gpu(name):
        if name in gpus_by_name:
            return gpus_by_name[name].memory_gb, gpus_by_name[name].bandwidth_tbps
        return gr.skip(), gr.skip()

    source.change(show_source, source, [preset, pasted, upload], queue=False, api_name=False)
    gpu.change(pick_gpu, gpu, [gpu_mem, bandwidth], queue=False, api_name=False)

    inputs = [
        source,
        preset,
        pasted,
        upload,
        context,
        batch,
        kv_dtype,
        group_size,
        tp,
        gpu,
        gpus,
        gpu_mem,
        bandwidth,
        reserve,
        weights,
        compare,
        kv_producing,
    ]
    outputs = [summary_box, formula, table, size, capacity, decode, gauge]

    def recalculate(*values):
        return calculate(ctx, *values)

    # arithmetic on bounded inputs (kvviz.limits): quick, so it never waits in a queue
    calculated = gr.on(
        [
            button.click,
            source.change,
            preset.change,
            kv_dtype.change,
            gpu.change,
            compare.change,
            context.submit,
            batch.submit,
            tp.submit,
            gpus.submit,
            kv_producing.submit,
        ],
        recalculate,
        inputs,
        outputs,
        api_name=False,
        concurrency_limit=None,
    )
    clear_on_refusal(calculated, outputs)
    # arithmetic: a show-me gets the calculator's outputs in its own event
    ctx.answers["memory.button"] = ShowMeAnswer(inputs, outputs, lambda request, *values: calculate(ctx, *values))
    if ctx.trace_state is not None:
        ctx.on_trace(lambda trace: live_comparison(ctx, trace), [ctx.trace_state], [live])

    gr.api(endpoint(ctx, api_memory), api_name="memory", concurrency_limit=None)
    memory_architectures.build(ctx)
    memory_engine.build(ctx)
