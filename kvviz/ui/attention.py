"""Attention tab: one head's heatmap, the step scrubber, the sink map (click to drill in) and why sinks exist.

Reads the session's finished trace (``ctx.trace_state``) and refreshes after every generation;
every number and figure comes from :mod:`kvviz.sinks` and :mod:`kvviz.figures.attention` and :mod:`kvviz.figures.sinks`.
"""

from __future__ import annotations

import gradio as gr

from kvviz.figures import attention as fig
from kvviz.figures import sinks as sinks_fig
from kvviz.safety import whole_number
from kvviz.sinks import group_text, sink_frame
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


# ---- handlers (module level so tests can call them) ---------------------------------------------
def head_view(info, trace, layer_v, head_v, view_v, log_v):
    """Group sentence and heatmap for the chosen layer/head/view."""
    text = group_text(info, _whole(head_v, "Head", 0, info.q_heads - 1))
    if not _ready(trace):
        return text, gr.skip()
    lyr, hd, _, _ = _selection(trace, layer_v, head_v)
    return text, _call(fig.attention_heatmap, trace, lyr, hd, bool(log_v), view_v == VIEWS[1])


def step_view(trace, layer_v, step_v, k_v):
    """All heads of the layer at the chosen step."""
    if not _ready(trace):
        return gr.skip()
    lyr, _, st, kk = _selection(trace, layer_v, 0, step_v, k_v)
    return _call(fig.step_chart, trace, lyr, st, kk)


def sink_views(trace, k_v):
    """Token strip, sink map, per-layer line, clickable table and norms for this k."""
    if not _ready(trace):
        return (gr.skip(),) * 5
    kk = _selection(trace, 0, 0, 0, k_v)[3]
    return (
        _call(sinks_fig.token_spans, trace, kk),
        _call(sinks_fig.sink_map, trace, kk),
        _call(sinks_fig.sink_line, trace, kk),
        _styled_sinks(trace, kk),
        _call(sinks_fig.norms_chart, trace, kk),
    )


def refresh(info, trace, layer_v, head_v, view_v, log_v, step_v, k_v):
    """A new trace arrived: fit the sliders to it and redraw everything (11 outputs)."""
    if not _ready(trace):
        return (EMPTY,) + (gr.skip(),) * 10
    n_steps = len(trace.steps)
    st = max(0, min(int(step_v or 0), n_steps - 1))
    kk = max(1, min(int(k_v or 4), trace.n_fed - 1))
    msg = f"Run of **{trace.n_prompt:,} prompt + {trace.n_generated} generated tokens**; " + (
        "maps are exact (one cell per token)."
        if trace.bin_factor == 1
        else f"maps are binned by {trace.bin_factor} positions (column sums and sink shares stay exact)."
    )
    return (
        msg,
        gr.Slider(minimum=0, maximum=max(1, n_steps - 1), value=st),
        gr.Slider(minimum=1, maximum=max(1, min(K_MAX, trace.n_fed - 1)), value=kk),
        *head_view(info, trace, layer_v, head_v, view_v, log_v),
        step_view(trace, layer_v, st, kk),
        *sink_views(trace, kk),
    )


def pick(index) -> tuple:
    """A click on the sink table at [row, column]: row = layer, column c ≥ 1 = query head c − 1
    (a click on the 'layer' column keeps the head)."""
    row, col = (int(i) for i in index)
    return row, (col - 1 if col >= 1 else gr.skip())


def build(ctx: AppContext) -> None:
    """Build the tab inside the caller's ``gr.Tab``."""
    info = ctx.info
    gr.Markdown(
        "What each head reads. Every layer and head of the last run, for the prompt and every generated "
        "token; the sink map shows at a glance which heads park their attention on the first tokens."
    )
    status = gr.Markdown(EMPTY, elem_id="attn-status")
    strip = gr.HighlightedText(
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
        layer = typed_slider(
            0,
            info.layers - 1,
            value=min(info.layers - 1, info.layers * 2 // 3),
            step=1,
            label="Layer",
            elem_id="attn-layer",
        )
        head = gr.Dropdown(
            [(f"q{h} (KV head {h // info.group_size})", h) for h in range(info.q_heads)],
            value=0,
            label="Query head",
            elem_id="attn-head",
        )
        view = gr.Radio(VIEWS, value=VIEWS[0], label="Show", elem_id="attn-view")
        log = gr.Checkbox(False, label="Log colour scale", elem_id="attn-log")
    group = gr.Markdown(group_text(info, 0), elem_id="attn-group")
    heatmap = gr.Plot(label="Attention heatmap", elem_id="attn-heatmap")
    gr.Markdown(fig.CAPTIONS["heatmap"], elem_classes="caption")

    gr.Markdown("### Step scrubber: what one new query reads")
    with gr.Row(equal_height=True):
        step = gr.Slider(
            0,
            1,
            value=0,
            step=1,
            label="Step (0 = the prefill's last query; then one per generated token)",
            elem_id="attn-step",
        )
        play_button(step, "attn-play")
    step_plot = gr.Plot(label="All heads of the layer at this step", elem_id="attn-step-chart")
    gr.Markdown(fig.CAPTIONS["step"], elem_classes="caption")

    gr.Markdown("### Sinks")
    k = gr.Slider(1, K_MAX, value=4, step=1, label="k: count the first k tokens as sinks", elem_id="attn-k")
    with gr.Row():
        with gr.Column():
            sink_plot = gr.Plot(label="Sink map", elem_id="attn-sink-map")
        line_plot = captioned_plot("Sink mass per layer", "attn-sink-line", sinks_fig.CAPTIONS["sink_line"])
    gr.Markdown(sinks_fig.CAPTIONS["sink_map"], elem_classes="caption")
    table = gr.Dataframe(
        waiting_table("Press Generate to see the sink map of every layer and head"),
        label="Sink map (% on the first k tokens): click a cell to open that layer and head",
        interactive=False,
        elem_id="attn-sink-table",
        max_height=420,
    )
    norms_plot = gr.Plot(label="Keys and values of the sinks", elem_id="attn-norms")
    gr.Markdown(sinks_fig.CAPTIONS["norms"], elem_classes="caption")

    ctx.components.update(
        {
            "attention.layer": layer,
            "attention.head": head,
            "attention.view": view,
            "attention.log": log,
            "attention.step": step,
            "attention.k": k,
            "attention.sink_table": table,
        }
    )

    state = ctx.trace_state
    head_inputs = [state, layer, head, view, log]
    for comp in (head, view, log):
        comp.change(lambda *a: head_view(info, *a), head_inputs, [group, heatmap], api_name=False)
    step.change(step_view, [state, layer, step, k], step_plot, api_name=False)

    def on_layer(trace, layer_v, head_v, view_v, log_v, step_v, k_v):
        """A layer out of range: the app's message once, and the slider back at the nearest layer (whose
        change then draws it); else both views of the layer."""
        message = in_range(layer_v, "Layer", 0, info.layers - 1)
        if message is not None:
            gr.Warning(message)
            try:
                nearest = min(max(int(float(layer_v)), 0), info.layers - 1)
            except (TypeError, ValueError, OverflowError):
                nearest = 0
            return nearest, gr.skip(), gr.skip(), gr.skip()
        return (
            gr.skip(),
            *head_view(info, trace, layer_v, head_v, view_v, log_v),
            step_view(trace, layer_v, step_v, k_v),
        )

    layer.change(on_layer, [state, layer, head, view, log, step, k], [layer, group, heatmap, step_plot], api_name=False)
    k.change(sink_views, [state, k], [strip, sink_plot, line_plot, table, norms_plot], api_name=False).then(
        step_view, [state, layer, step, k], step_plot, api_name=False
    )

    def on_pick(evt: gr.SelectData):
        return pick(evt.index)

    table.select(on_pick, None, [layer, head], api_name=False)
    ctx.on_trace(
        lambda *a: refresh(info, *a),
        [state, layer, head, view, log, step, k],
        [status, step, k, group, heatmap, step_plot, strip, sink_plot, line_plot, table, norms_plot],
    )
