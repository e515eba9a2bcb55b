"""The Memory calculator's request and answer, by name: :class:`Form` (the widgets' raw values), :func:`check`
(the values checked into one :class:`~kvviz.memory.report.MemoryRequest`, the KV dtype with its scale group),
and :func:`draw` (every number, table and chart of the tab from that one request, so the page agrees with itself).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvviz.figures import memory as fig
from kvviz.limits import calculator_number
from kvviz.memory.capacity import gpu_presets
from kvviz.memory.estimate import resolve_kv_dtype
from kvviz.memory.layout import CacheLayout, cache_layout, head_dim_note, load_preset, stated_weights_gb
from kvviz.memory.report import MemoryRequest, report, summary
from kvviz.memory.sharing import share_kv
from kvviz.ui.memory.sources import resolve_layout
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.sessions import user_errors

COMPARE_DEFAULT = ["Llama-3-8B", "Mistral-7B-v0.1", "gemma-2-9b", "gpt-oss-20b", "DeepSeek-V3"]
GPUS = gpu_presets()
FIRST_GPU = next(iter(GPUS))


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


@dataclass(frozen=True)
class Form:
    """The calculator's inputs by name, as its widgets hold them (raw: :func:`check` reads them). The defaults
    are the example the tab opens on, the chapter's Llama-3-70B on 8 × H100; one widget per field."""

    source: str = "Preset"
    preset: str = "Llama-3-70B"
    pasted: str = ""
    upload: str | None = None
    context: Any = 8192
    batch: Any = 1
    kv_dtype: str = "bf16"
    group_size: Any = 0
    tp: Any = 0
    kv_producing: Any = 0
    gpu: str = FIRST_GPU
    gpus: Any = 8
    gpu_mem_gb: Any = GPUS[FIRST_GPU].memory_gb
    bandwidth_tbps: Any = GPUS[FIRST_GPU].bandwidth_tbps
    reserve: Any = 0.1
    weights_gb: Any = 0
    compare: tuple[str, ...] = tuple(COMPARE_DEFAULT)


@dataclass(frozen=True)
class Calculation:
    """A checked calculator request: the memory question (with the KV dtype and its scale group, which every
    number and chart of the page reads), the models to compare, and what to say beside the answer."""

    request: MemoryRequest
    compare: tuple[CacheLayout, ...]
    notes: tuple[str, ...]
    weights_known: bool


@dataclass(frozen=True)
class Drawn:
    """What the page shows for one calculation, by name (the tab's output components carry the same names)."""

    summary: str
    formula: str
    table: pd.DataFrame
    size: go.Figure
    capacity: go.Figure | None
    decode: go.Figure | None
    gauge: go.Figure | None


def check(ctx: AppContext, form: Form) -> Calculation:
    """The form's values checked against their bounds (``gr.Error`` with what to fix), as one named request."""
    layout = resolve_layout(ctx, form.source, form.preset, form.pasted, form.upload)
    if form.kv_producing not in (0, 0.0, None, ""):  # 0: who stores K/V as the config says
        producing = _number("kv_producing", form.kv_producing, "KV-producing layers")
        with user_errors():
            layout = share_kv(layout, producing)
    gpus = _number("gpus", form.gpus, "Number of GPUs", blank=1)
    tp = gpus if form.tp in (0, 0.0, None, "") else _number("tp", form.tp, "Tensor parallelism")  # 0 = all GPUs
    group = None if form.group_size in (0, 0.0, None, "") else _number("group_size", form.group_size, "Group size")
    weights = None if form.weights_gb in (0, 0.0) else _number("weights_gb", form.weights_gb, "Weights (GB)")
    notes = [n for n in [head_dim_note(layout)] if n]
    if form.source == "Loaded model" and weights is None:
        weights = ctx.info.weight_bytes / 1e9
    elif form.source == "Preset" and weights is None and stated_weights_gb(form.preset) is not None:
        weights = stated_weights_gb(form.preset)
        counted = (
            f" (parameters × 2 B would give {layout.num_parameters * 2 / 1e9:.1f} GB)" if layout.num_parameters else ""
        )
        notes.append(f"Weights: {weights:g} GB, the figure the source uses{counted}; type a number to override.")
    with user_errors():
        kv_dtype = resolve_kv_dtype(form.kv_dtype, group)
        others = tuple(cache_layout(load_preset(n)) for n in (form.compare or []) if n != layout.name)
    request = MemoryRequest(
        layout,
        _number("context", form.context, "Context", blank=8192),
        _number("batch", form.batch, "Batch", blank=1),
        kv_dtype,
        tp,
        gpus,
        _number("gpu_mem_gb", form.gpu_mem_gb, "GPU memory (GB)"),
        _number("reserve", form.reserve, "Reserve", blank=0.1),
        weights,
        "bf16",
        _number("bandwidth_tbps", form.bandwidth_tbps, "Bandwidth (TB/s)"),
    )
    return Calculation(request, others, tuple(notes), layout.num_parameters is not None or weights is not None)


def draw(calc: Calculation) -> Drawn:
    """Every output of the tab for one checked request: summary, formula, table and four figures."""
    req = calc.request
    layout, context, dtype, tp = req.layout, req.context, req.kv_dtype, req.tp_degree
    with user_errors():  # sizes first: bad input here is the user's to fix
        r = report(replace(req, gpu_mem_gb=None, bandwidth_tbps=None))
        formula = fig.formula_markdown(layout, r.estimate)
        table = fig.comparison_table(layout, context, dtype).drop(columns=["bytes_per_token", "bytes_per_sequence"])
        size = fig.size_vs_context([layout, *calc.compare], _contexts(context), dtype)
    note = ""
    if not calc.weights_known:
        note = "Give the weights in GB to see capacity and decode time (this config has no parameter count)."
    elif req.gpu_mem_gb is not None or req.bandwidth_tbps is not None:
        try:  # capacity may legitimately not exist (weights larger than the GPUs): say so, keep the sizes
            r = report(req)
        except ValueError as exc:
            note = str(exc)
    cap = dec = gauge = kv_budget = None
    if r.capacity is not None:
        kv_budget = r.capacity.budget.kv_budget_bytes
        cap = fig.capacity_vs_context(layout, kv_budget, _contexts(context, 1024), dtype, tp, context)
        gauge = fig.budget_gauge(r.estimate.total_bytes, kv_budget)
    if r.decode is not None and req.bandwidth_tbps is not None:
        contexts = _contexts(context, 1024)
        dec = fig.decode_time_vs_context(
            layout,
            r.decode.weight_bytes,
            req.batch,
            req.bandwidth_tbps,
            req.gpu_count,
            contexts,
            dtype,
            tp,
            kv_budget,
            context,
        )
    text = summary(r, markdown=True) + "".join(f"\n\nℹ {n}" for n in calc.notes) + (f"\n\n⚠ {note}" if note else "")
    return Drawn(text, formula, table, size, cap, dec, gauge)


def calculate(ctx: AppContext, form: Form) -> Drawn:
    """The form checked, then drawn: what one press of Calculate shows."""
    return draw(check(ctx, form))
