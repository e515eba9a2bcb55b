"""Attention tab: one head's heatmap, the step scrubber, the sink map (click to drill in) and why sinks exist.

Reads the session's finished trace (``ctx.trace_state``) and refreshes after every generation;
every number and figure comes from :mod:`kvviz.sinks` and :mod:`kvviz.figures.attention` and :mod:`kvviz.figures.sinks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from kvviz.figures import attention as fig
from kvviz.figures import sinks as sinks_fig
from kvviz.lessons.objectives import SINKS
from kvviz.safety import whole_number
from kvviz.sinks import group_text, sink_frame
from kvviz.ui.page.first_sight import Example, once, trace_views
from kvviz.ui.page.play import play_button
from kvviz.ui.page.widgets import captioned_plot, in_range, typed_slider, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.sessions import user_errors

VIEWS = ["this head", "mean of its KV group"]
K_MAX = 64  # the sink slider's ceiling (any k works in the library; the slider stays usable)
EMPTY = "Generate a run on the **Generate** tab first: this view fills in when it finishes."


def _whole(value, what: str, lo: int, hi: int) -> int:
    with user_errors():
        return whole_number(value, what, lo, hi)  # refuses NaN, infinities, fractions and text


def _ready(trace) -> bool:
    return trace is not None and getattr(trace, "colsum", None) is not None


def _selection(trace, layer, head, step=0, k=4) -> tuple[int, int, int, int]:
    """Checked layer, head, step and k for this trace (gr.Error says what to fix)."""
    m = trace.model
    return (
        _whole(layer, "Layer", 0, m.layers - 1),
        _whole(head, "Head", 0, m.q_heads - 1),
        _whole(step, "Step", 0, len(trace.steps) - 1),
        _whole(k, "k", 1, max(trace.n_fed - 1, 1)),
    )


def _call(fn, *args):
    """Library ValueErrors become readable messages in the page."""
    with user_errors():
        return fn(*args)


def _styled_sinks(trace, k: int):
    """The sink map as a table: one row per layer, one column per query head, cells coloured by percent."""
    df = _call(sink_frame, trace, k)
    heads = [c for c in df.columns if c != "layer"]

    def colour(v: float) -> str:
        t = max(0.0, min(float(v) / 100, 1.0))
        r, g, b = int(255 - 20 * t), int(245 - 150 * t), int(235 - 200 * t)
        return f"background-color: rgb({r},{g},{b}); color: {'#fff' if t > 0.7 else '#000'}"

    return df.style.map(colour, subset=heads).format("{:.0f}", subset=heads)


# ---- what each handler draws, by name (module level so tests can call them) ------------------------------------
@dataclass
class HeadView:
    """The group sentence and one head's heatmap (None before any run)."""

    group: str
    heatmap: object | None


@dataclass
class SinkViews:
    """The token strip, sink map, per-layer line, clickable table and norms for one k."""

    strip: object
    sink_map: object
    sink_line: object
    table: object
    norms: object


@dataclass
class Refreshed:
    """Everything a new trace redraws: its status line, the sliders fitted to it, and every view."""

    status: str
    step: object
    k: object
    head: HeadView
    step_chart: object
    sinks: SinkViews


def head_view(info, trace, layer_v, head_v, view_v, log_v) -> HeadView:
    """Group sentence and heatmap for the chosen layer/head/view."""
    text = group_text(info, _whole(head_v, "Head", 0, info.q_heads - 1))
    if not _ready(trace):
        return HeadView(text, None)
    lyr, hd, _, _ = _selection(trace, layer_v, head_v)
    return HeadView(text, _call(fig.attention_heatmap, trace, lyr, hd, bool(log_v), view_v == VIEWS[1]))


def step_view(trace, layer_v, step_v, k_v):
    """All heads of the layer at the chosen step (None before any run)."""
    if not _ready(trace):
        return None
    lyr, _, st, kk = _selection(trace, layer_v, 0, step_v, k_v)
    return _call(fig.step_chart, trace, lyr, st, kk)


def sink_views(trace, k_v) -> SinkViews | None:
    """Token strip, sink map, per-layer line, clickable table and norms for this k (None before any run)."""
    if not _ready(trace):
        return None
    kk = _selection(trace, 0, 0, 0, k_v)[3]
    return SinkViews(
        _call(sinks_fig.token_spans, trace, kk),
        _call(sinks_fig.sink_map, trace, kk),
        _call(sinks_fig.sink_line, trace, kk),
        _styled_sinks(trace, kk),
        _call(sinks_fig.norms_chart, trace, kk),
    )


def refresh(info, trace, layer_v, head_v, view_v, log_v, step_v, k_v) -> Refreshed | None:
    """A new trace arrived: fit the sliders to it and redraw everything (None before any run)."""
    if not _ready(trace):
        return None
    n_steps = len(trace.steps)
    st = max(0, min(int(step_v or 0), n_steps - 1))
    kk = max(1, min(int(k_v or 4), trace.n_fed - 1))
    msg = f"Run of **{trace.n_prompt:,} prompt + {trace.n_generated} generated tokens**; " + (
        "maps are exact (one cell per token)."
        if trace.bin_factor == 1
        else f"maps are binned by {trace.bin_factor} positions (column sums and sink shares stay exact)."
    )
    sinks = sink_views(trace, kk)
    assert sinks is not None
    return Refreshed(
        msg,
        gr.Slider(minimum=0, maximum=max(1, n_steps - 1), value=st),
        gr.Slider(minimum=1, maximum=max(1, min(K_MAX, trace.n_fed - 1)), value=kk),
        head_view(info, trace, layer_v, head_v, view_v, log_v),
        step_view(trace, layer_v, st, kk),
        sinks,
    )


def pick(index) -> tuple[int, int | None]:
    """A click on the sink table at [row, column]: row = layer, column c ≥ 1 = query head c − 1
    (None: a click on the 'layer' column keeps the head)."""
    row, col = (int(i) for i in index)
    return row, (col - 1 if col >= 1 else None)


@dataclass
class _Views:
    """Every component of the tab, by name."""

    example: gr.Markdown
    status: gr.Markdown
    strip: gr.HighlightedText
    layer: gr.Slider
    head: gr.Dropdown
    view: gr.Radio
    log: gr.Checkbox
    group: gr.Markdown
    heatmap: gr.Plot
    step: gr.Slider
    step_plot: gr.Plot
    k: gr.Slider
    sink_plot: gr.Plot
    line_plot: gr.Plot
    table: gr.Dataframe
    norms_plot: gr.Plot

    def head_view(self, h: HeadView) -> dict:
        return {self.group: h.group, self.heatmap: h.heatmap if h.heatmap is not None else gr.skip()}

    def step_view(self, chart) -> dict:
        return {self.step_plot: chart if chart is not None else gr.skip()}

    def sinks(self, s: SinkViews | None) -> dict:
        if s is None:
            return {c: gr.skip() for c in self.sink_outputs()}
        comps = [self.strip, self.sink_plot, self.line_plot, self.table, self.norms_plot]
        return dict(zip(comps, [s.strip, s.sink_map, s.sink_line, s.table, s.norms]))

    def refreshed(self, r: Refreshed | None) -> dict:
        if r is None:
            return {self.status: EMPTY}  # every other view is left as it is
        fitted = {self.status: r.status, self.step: r.step, self.k: r.k}
        return {**fitted, **self.head_view(r.head), **self.step_view(r.step_chart), **self.sinks(r.sinks)}

    def refresh_outputs(self) -> list:
        return [self.status, self.step, self.k, self.group, self.heatmap, self.step_plot, *self.sink_outputs()]

    def sink_outputs(self) -> list:
        return [self.strip, self.sink_plot, self.line_plot, self.table, self.norms_plot]


def build(ctx: AppContext) -> None:
    """Build the tab inside the caller's ``gr.Tab``: its layout, then its wiring."""
    _wire(ctx, _layout(ctx.info))


def _layout(info) -> _Views:
    gr.Markdown(
        "What each head reads. Every layer and head of the last run, for the prompt and every generated "
        "token; the sink map shows at a glance which heads park their attention on the first tokens."
    )
    c: dict = {"example": gr.Markdown(elem_id="attn-example"), "status": gr.Markdown(EMPTY, elem_id="attn-status")}
    c["strip"] = gr.HighlightedText(
        label="Tokens: sinks (first k) and the most attended",
        elem_id="attn-tokens",
        color_map=sinks_fig.TOKEN_COLORS,
        combine_adjacent=False,
        show_legend=True,
        show_inline_category=False,
    )
    gr.Markdown(sinks_fig.CAPTIONS["tokens"], elem_classes="caption")
    gr.Markdown("### One head: queries × keys")
    with gr.Row():
        c["layer"] = typed_slider(
            0, info.layers - 1, value=min(info.layers - 1, info.layers * 2 // 3), step=1, label="Layer",
            elem_id="attn-layer",
        )  # fmt: skip
        c["head"] = gr.Dropdown(
            [(f"q{h} (KV head {h // info.group_size})", h) for h in range(info.q_heads)],
            value=0,
            label="Query head",
            elem_id="attn-head",
        )
        c["view"] = gr.Radio(VIEWS, value=VIEWS[0], label="Show", elem_id="attn-view")
        c["log"] = gr.Checkbox(False, label="Log colour scale", elem_id="attn-log")
    c["group"] = gr.Markdown(group_text(info, 0), elem_id="attn-group")
    c["heatmap"] = gr.Plot(label="Attention heatmap", elem_id="attn-heatmap")
    gr.Markdown(fig.CAPTIONS["heatmap"], elem_classes="caption")
    gr.Markdown("### Step scrubber: what one new query reads")
    with gr.Row(equal_height=True):
        step_label = "Step (0 = the prefill's last query; then one per generated token)"
        c["step"] = gr.Slider(0, 1, value=0, step=1, label=step_label, elem_id="attn-step")
        play_button(c["step"], "attn-play")
    c["step_plot"] = gr.Plot(label="All heads of the layer at this step", elem_id="attn-step-chart")
    gr.Markdown(fig.CAPTIONS["step"], elem_classes="caption")
    gr.Markdown("### Sinks")
    c["k"] = gr.Slider(1, K_MAX, value=4, step=1, label="k: count the first k tokens as sinks", elem_id="attn-k")
    with gr.Row():
        with gr.Column():
            c["sink_plot"] = gr.Plot(label="Sink map", elem_id="attn-sink-map")
        c["line_plot"] = captioned_plot("Sink mass per layer", "attn-sink-line", sinks_fig.CAPTIONS["sink_line"])
    gr.Markdown(sinks_fig.CAPTIONS["sink_map"], elem_classes="caption")
    c["table"] = gr.Dataframe(
        waiting_table("Press Generate to see the sink map of every layer and head"),
        label="Sink map (% on the first k tokens): click a cell to open that layer and head",
        interactive=False,
        elem_id="attn-sink-table",
        max_height=420,
    )
    c["norms_plot"] = gr.Plot(label="Keys and values of the sinks", elem_id="attn-norms")
    gr.Markdown(sinks_fig.CAPTIONS["norms"], elem_classes="caption")
    return _Views(**c)


def _wire(ctx: AppContext, v: _Views) -> None:
    """Register the inputs the Learn tab sets, redraw on every control, and draw each new trace."""
    info, state = ctx.info, ctx.trace_state
    names = ("layer", "head", "view", "log", "step", "k")
    ctx.components.update({f"attention.{n}": getattr(v, n) for n in names})
    ctx.components["attention.sink_table"] = v.table
    head_inputs = [state, v.layer, v.head, v.view, v.log]
    for comp in (v.head, v.view, v.log):
        comp.change(lambda *a: v.head_view(head_view(info, *a)), head_inputs, [v.group, v.heatmap], api_name=False)
    step_inputs = [state, v.layer, v.step, v.k]
    v.step.change(lambda *a: v.step_view(step_view(*a)), step_inputs, [v.step_plot], api_name=False)

    def on_layer(trace, layer_v, head_v, view_v, log_v, step_v, k_v) -> dict:
        """A layer out of range: the app's message once, and the slider back at the nearest layer (whose
        change then draws it); else both views of the layer."""
        message = in_range(layer_v, "Layer", 0, info.layers - 1)
        if message is not None:
            gr.Warning(message)
            try:
                nearest = min(max(int(float(layer_v)), 0), info.layers - 1)
            except (TypeError, ValueError, OverflowError):
                nearest = 0
            return {v.layer: nearest}
        shown = v.head_view(head_view(info, trace, layer_v, head_v, view_v, log_v))
        return {**shown, **v.step_view(step_view(trace, layer_v, step_v, k_v))}

    all_inputs = [state, v.layer, v.head, v.view, v.log, v.step, v.k]
    v.layer.change(on_layer, all_inputs, [v.layer, v.group, v.heatmap, v.step_plot], api_name=False)
    v.k.change(lambda t, k: v.sinks(sink_views(t, k)), [state, v.k], v.sink_outputs(), api_name=False).then(
        lambda *a: v.step_view(step_view(*a)), step_inputs, [v.step_plot], api_name=False
    )

    def on_pick(evt: gr.SelectData) -> dict:
        layer, head = pick(evt.index)
        return {v.layer: layer, **({v.head: head} if head is not None else {})}

    v.table.select(on_pick, None, [v.layer, v.head], api_name=False)
    views = v.refresh_outputs()
    ctx.on_trace(lambda *a: v.refreshed(refresh(info, *a)), all_inputs, views)
    ctx.examples["tab_attention"] = (example(ctx, views), v.example)


def example(ctx: AppContext, views: list) -> Example:
    """The stored generation of Learn's sink-map show-me, as the session's trace (only while it has none)."""
    state = ctx.trace_state
    planner = ctx.planners.get("generate.button")
    return Example(
        what="the needle passage through the real model with 16 tokens generated",
        change="generate your own run on the **Generate** tab (every view here follows it)",
        key=once(lambda: planner(SINKS.values) if planner is not None else None),
        draw=lambda value, entry, request: {state: value[0], **trace_views(ctx, value[0], views)},
        outputs=[state, *views],
        values={state: None},
    )
