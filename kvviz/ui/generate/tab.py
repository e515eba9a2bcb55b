"""Generate tab: type a prompt, watch tokens stream while the cache grows, check cached == recompute.

The layout and wiring are here; the checked request, the streamed run and ``/generate`` are the model
jobs in :mod:`kvviz.ui.generate.run`, what a streamed step shows is :mod:`kvviz.ui.generate.stream`.
"""

from __future__ import annotations

import time

import gradio as gr
from gradio.components import Component
from gradio.context import Context

from kvviz.examples import GENERATE_EXAMPLE, examples
from kvviz.figures import generate as fig
from kvviz.lessons.objectives import EQUIVALENCE
from kvviz.limits import MAX_STEP
from kvviz.safety import whole_number
from kvviz.ui.generate import chat as generate_chat
from kvviz.ui.generate import run as generate_run
from kvviz.ui.generate.run import (  # noqa: F401  (re-exported: where tests and other tabs find them)
    GPU_BUDGETS,
    room_for_tokens,
    validate_request,
)
from kvviz.ui.generate.stream import FIGURES_S
from kvviz.ui.generate.views import Form, Views, blank_charts, chart_plots
from kvviz.ui.page import plot_redraw
from kvviz.ui.page.play import play_button
from kvviz.ui.page.widgets import clear_on_refusal, typed_slider
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.precompute import live_box, readiness
from kvviz.ui.serving.sessions import user_errors
from kvviz.units import plural

# the first screen waits this long for the start-up to reach its example (users' jobs go first), then says
# how to run it instead
OPENING_WAIT_S = 300.0


def build(ctx: AppContext):
    """Build the tab (its layout, then :func:`wire`); returns the Generate event so the app can chain other
    tabs' refreshes after it."""
    ex, f = examples(), opening_form(ctx)
    gr.Markdown(
        "Type a prompt and press **Generate**. The model is "
        f"**{ctx.info.name}**; every layer's keys and values are captured as it writes."
    )
    w: dict[str, Component] = {}
    with gr.Row():
        with gr.Column(scale=3):
            w["prompt"] = gr.Textbox(label="Prompt", lines=4, value=f.prompt, elem_id="prompt")
            example = gr.Dropdown(list(ex), label="Examples", value=GENERATE_EXAMPLE)
        with gr.Column(scale=2):
            w["chat"] = gr.Checkbox(value=f.chat, label="Use the chat template")
            w["max_new"] = typed_slider(
                1, ctx.settings.max_new_tokens, value=f.max_new, step=1, label="Max new tokens", elem_id="gen-max-new"
            )
            with gr.Accordion("Sampling", open=False):
                w["temperature"] = gr.Slider(0.0, 2.0, value=f.temperature, step=0.05, label="Temperature (0 = greedy)")
                w["top_p"] = gr.Slider(0.05, 1.0, value=f.top_p, step=0.05, label="Top-p")
                w["seed"] = gr.Number(value=f.seed, precision=0, label="Seed")
            w["budget"] = gr.Dropdown(list(GPU_BUDGETS), value=f.budget, label="GPU budget for the gauge")
            with gr.Row():
                go_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
            w["fresh"] = live_box("generate-live")
    status = gr.Markdown(elem_id="gen-status")
    with gr.Row():  # the run's tokens beside its charts: all on the first screen
        with gr.Column(scale=2):
            tokens = gr.HighlightedText(
                label=f"Tokens (prompt / generated; during a run redrawn with the charts, every {FIGURES_S:g} s)",
                elem_id="token-stream",
                # named: Gradio's page turns a colour code into its shades through a canvas on every update (every
                # streamed message); a name of its palette it looks up
                color_map={"prompt": "blue", "generated": "orange"},
                combine_adjacent=False,
                show_legend=True,
                show_inline_category=False,
            )
            answer = gr.Textbox(label="Generated text", lines=3, elem_id="answer")
            with gr.Row(equal_height=True):
                step = gr.Slider(0, 1, value=0, step=1, label="Replay: decode step (0 = prefill)", elem_id="gen-step")
                play_button(step, "gen-play")
        blank = blank_charts(generate_run.frame_of(ctx, f.budget))
        charts = chart_plots(blank)
    chat_ui = generate_chat.build(ctx)
    w.update(multi=chat_ui["multi"], template=chat_ui["template"], conversation=chat_ui["state"])
    gr.Markdown(fig.model_card(ctx.info), elem_id="model-card")
    check = gr.Markdown(elem_id="equivalence")
    waste = gr.Markdown(elem_id="waste")
    with gr.Row():
        npz = gr.File(label="Trace (.npz)", interactive=False, elem_id="gen-npz")
        csv = gr.File(label="Steps (.csv)", interactive=False, elem_id="gen-csv")
    redraw = plot_redraw.redraw_box("gen-redraw")
    views = Views(w, ctx.trace_state, status, tokens, answer, check, waste, npz, csv, step, redraw, **charts)
    example.change(
        lambda name: (ex[name][0], ex[name][1]), example, [w["prompt"], w["chat"]], queue=False, api_name=False
    )
    ctx.components.update({f"generate.{name}": w[name] for name in ("prompt", "chat", "max_new")})
    ctx.components.update({"generate.example": example, "generate.button": go_btn, "generate.step": step})
    return wire(ctx, views, go_btn, stop_btn, chat_ui, blank)


def wire(ctx: AppContext, views: Views, go_btn, stop_btn, chat_ui: dict, blank: dict):
    """The tab's events: Generate (checked once, then streamed into ``views``), Stop, replay, the chat
    section after a turn, the opening example, and the endpoints. ``blank``: the charts the page opens on, by
    field name (:func:`~kvviz.ui.generate.views.blank_charts`), which a refusal puts back."""
    ctx.planners["generate.button"] = lambda values: generate_run.plan(ctx, values)
    # bad input (and a refusal) is answered by a quick step with no outputs, so its message is a toast; the
    # previous run's results are then cleared (the session's trace stays for the other tabs), so they never sit
    # under the refused settings. The run step takes its place in the room when it starts. Its progress is the
    # status line's own text (its place in the room, the prefill, the tokens, the check): Gradio's progress
    # tracker adds nothing to it, and its timer redraws the page every frame while a run streams, CPU that a
    # browser on the server's own cores (a laptop, a lecture machine) takes from the model (bench/page_speed.py)
    checked, event = generate_run.tab_job(views).button(
        ctx,
        go_btn,
        set(views.inputs.values()),
        views.outputs(),
        show_progress="hidden",
    )
    # only the check's refusal: a run ended by Stop keeps its results; the charts go back to their blank ones, on
    # which the next run draws in place (kvviz/ui/page/plot_redraw.py)
    clear_on_refusal(checked, views.shown(), blank={getattr(views, name): f for name, f in blank.items()})

    chat_views = chat_ui["views"]

    def after_turn(trace, conversation, multi) -> dict:
        turn = generate_chat.after_turn(ctx, trace, conversation, multi)
        if turn is None:  # not a new turn: an empty dict is refused by Gradio, a skip leaves every view as it is
            return gr.skip()
        return {c: getattr(turn, name) for name, c in chat_views.items()}

    event.success(
        after_turn,
        [ctx.trace_state, chat_ui["state"], chat_ui["multi"]],
        list(chat_views.values()),
        queue=False,
        api_name=False,
        show_progress="hidden",
    )

    def stop(request: gr.Request):
        ctx.stop_flag(request).set()

    # on ZeroGPU the run is in a forked worker that never sees the flag: Stop cancels the call, which ends it
    cancels = [event] if ctx.settings.zero_gpu else None
    stop_btn.click(stop, None, None, queue=False, api_name=False, cancels=cancels)
    # the visitor's own moves only (``input``): a run or the opening example sets the slider and sends the views
    # it shows in the same answer, so its ``change`` would send the token strip and cache growth twice
    views.step.input(
        lambda trace, step: replay(views, trace, step),
        [ctx.trace_state, views.step],
        [views.tokens, views.growth],
        api_name=False,
        show_progress="hidden",
        trigger_mode="always_last",  # as ``change`` did: a step moved while one draws is drawn after it, not dropped
    )
    opened = opening(ctx, views)
    if opened is not None:  # the session's own run takes the page: the opening example stops waiting or drawing
        go_btn.click(None, None, None, cancels=[opened], queue=False, api_name=False)

    generate_run.api_generate_job.api(ctx, api_name="generate")
    generate_run.api_chat_job.api(ctx, api_name="chat")

    def api_engine() -> dict:
        """The engine's counters (runs submitted and shared, forwards, largest batch) and its prefix
        cache (blocks, bytes held, hit rate): what the room's requests shared."""
        return ctx.engine.snapshot()

    gr.api(api_engine, api_name="engine", queue=False)
    return event


def opening(ctx: AppContext, views: Views):
    """The page opens on the stored chat example (the show-me "Generate and check cached = recomputed"): its
    token stream, cache growth and memory gauge drawn at once (the form opens on it: :func:`opening_form`), and
    one line saying what it is and how to try your own; while the server still prepares it, how far it got.
    Returns the page-load event (None when there is no page or the deployment's limits refuse the example)."""
    root = Context.root_block
    if root is None:
        return None
    values = EQUIVALENCE.values
    try:
        key = generate_run.plan(ctx, values)  # computed first at start-up (or read back from disk)
        a = generate_run.ask(ctx, generate_run.form_of(values))
    except gr.Error:  # a deployment whose limits refuse the example: the page opens on its form
        return None
    what = f"Example “{GENERATE_EXAMPLE}” ({plural(a.n_new, 'new token')}, greedy)"
    yours = "change the prompt (or pick another example) and press **Generate** to try your own"

    def computing() -> bool:
        """The start-up is computing examples now (it pauses while users' jobs run)."""
        return ctx.settings.precompute and any(e.state == "running" for e in ctx.store.entries())

    def show(request: gr.Request):
        entry, deadline = ctx.store.entry(key), time.monotonic() + OPENING_WAIT_S
        while entry is not None and entry.state == "pending" and computing() and time.monotonic() < deadline:
            yield {views.status: f"{what}: waiting to be prepared at start-up ({readiness(ctx)})"}
            time.sleep(0.5)
        if entry is None or entry.state not in ("running", "done"):
            ready = f" ({readiness(ctx)})" if ctx.settings.precompute else ""
            yield {views.status: f"{what}: press **Generate** to run it, or {yours}.{ready}"}
            return
        for out in generate_run.stored(ctx, views, a, entry, request):
            if views.trace in out:  # the finished example: what it is, and how to try your own
                out[views.status] = f"{what}, stored: {yours}. ({out[views.status]})"
            yield out

    # the form is not among the outputs: it opens on the example (:func:`opening_form`), and what a visitor types
    # before this answer arrives (a busy server's seconds) stays
    return root.load(show, None, views.outputs(), api_name=False, concurrency_limit=None, show_progress="hidden")


def opening_form(ctx: AppContext) -> Form:
    """The form the tab opens on: the opening example's (:func:`opening` draws its run), or the tab's defaults
    where the deployment's limits refuse it. Set in the page as it is built, never by an answer that could
    arrive after the visitor has started typing."""
    f = generate_run.form_of(EQUIVALENCE.values)
    try:
        generate_run.ask(ctx, f)
    except gr.Error:
        return Form()
    return f


def replay(views: Views, trace, step):
    """The token strip and cache growth as they were after decode step ``step`` of the session's run (no run:
    both left as they are)."""
    if trace is None:
        return gr.skip()
    with user_errors():
        upto = whole_number(step or 0, "Step", 0, MAX_STEP)
    return {views.tokens: fig.token_spans(trace, upto), views.growth: fig.cache_growth(trace, upto=upto)}
