"""Generate tab: type a prompt, watch tokens stream while the cache grows, check cached == recompute.

The layout and wiring are here; the checked request, the streamed run and ``/generate`` are the model
jobs in :mod:`kvviz.ui.generate.run`, what a streamed step shows is :mod:`kvviz.ui.generate.stream`.
"""

from __future__ import annotations

import gradio as gr

from kvviz.examples import GENERATE_EXAMPLE, examples
from kvviz.figures import generate as fig
from kvviz.limits import MAX_STEP
from kvviz.safety import whole_number
from kvviz.ui.generate import chat as generate_chat
from kvviz.ui.generate import run as generate_run
from kvviz.ui.generate.run import (  # noqa: F401  (re-exported: where tests and other tabs find them)
    GPU_BUDGETS,
    room_for_tokens,
    validate_request,
)
from kvviz.ui.page.play import play_button
from kvviz.ui.page.widgets import clear_on_refusal, typed_slider
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.precompute import live_box
from kvviz.ui.serving.sessions import user_errors


def build(ctx: AppContext):
    """Build the tab; returns the Generate event so the app can chain other tabs' refreshes after it."""
    ex = examples()
    gr.Markdown(
        "Type a prompt and press **Generate**. The model is "
        f"**{ctx.info.name}**; every layer's keys and values are captured as it writes."
    )
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt", lines=4, value=ex[GENERATE_EXAMPLE][0], elem_id="prompt")
            example = gr.Dropdown(list(ex), label="Examples", value=GENERATE_EXAMPLE)
        with gr.Column(scale=2):
            chat = gr.Checkbox(value=True, label="Use the chat template")
            max_new = typed_slider(
                1, ctx.settings.max_new_tokens, value=48, step=1, label="Max new tokens", elem_id="gen-max-new"
            )
            with gr.Accordion("Sampling", open=False):
                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                seed = gr.Number(value=0, precision=0, label="Seed")
            budget = gr.Dropdown(list(GPU_BUDGETS), value="T4 (16 GB)", label="GPU budget for the gauge")
            with gr.Row():
                go_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
            fresh = live_box("generate-live")
    status = gr.Markdown(elem_id="gen-status")
    tokens = gr.HighlightedText(
        label="Tokens (prompt / generated)",
        elem_id="token-stream",
        color_map={"prompt": "#cfe2ff", "generated": "#ffd8a8"},
        combine_adjacent=False,
        show_legend=True,
        show_inline_category=False,
    )
    answer = gr.Textbox(label="Generated text", lines=3, elem_id="answer")
    with gr.Row(equal_height=True):
        step = gr.Slider(0, 1, value=0, step=1, label="Replay: decode step (0 = prefill)", elem_id="gen-step")
        play_button(step, "gen-play")
    with gr.Row():
        with gr.Column():
            growth = gr.Plot(label="Cache growth", elem_id="cache-growth")
            gr.Markdown(fig.CAPTIONS["growth"])
        with gr.Column():
            gauge = gr.Plot(label="Memory gauge", elem_id="memory-gauge")
            gr.Markdown(fig.CAPTIONS["gauge"])
    chat_ui = generate_chat.build(ctx)
    gr.Markdown(fig.model_card(ctx.info), elem_id="model-card")
    check = gr.Markdown(elem_id="equivalence")
    waste = gr.Markdown(elem_id="waste")
    with gr.Row():
        download_npz = gr.File(label="Trace (.npz)", interactive=False)
        download_csv = gr.File(label="Steps (.csv)", interactive=False)

    ctx.components.update(
        {
            "generate.prompt": prompt,
            "generate.chat": chat,
            "generate.max_new": max_new,
            "generate.example": example,
            "generate.button": go_btn,
            "generate.step": step,
        }
    )
    example.change(lambda name: (ex[name][0], ex[name][1]), example, [prompt, chat], queue=False, api_name=False)

    defaults = {
        "generate.prompt": prompt.value,
        "generate.chat": chat.value,
        "generate.max_new": max_new.value,
        "temperature": temperature.value,
        "top_p": top_p.value,
        "seed": seed.value,
    }
    ctx.planners["generate.button"] = lambda values: generate_run.plan(ctx, values, defaults)
    outputs = [ctx.trace_state, status, tokens, answer, growth, gauge, check, waste, download_npz, download_csv, step]
    # bad input (and a refusal) is answered by a quick step with no outputs, so its message is a toast; the
    # previous run's results are then cleared (the session's trace stays for the other tabs), so they never sit
    # under the refused settings. The run step takes its place in the room when it starts. Its progress
    # shows on the status line only: Gradio's full progress pulses every output while a run streams, and on a
    # small machine those animations take CPU from the model
    checked, event = generate_run.generation.button(
        ctx,
        go_btn,
        [prompt, chat, max_new, temperature, top_p, seed, budget, fresh, chat_ui["multi"], chat_ui["template"]]
        + [chat_ui["state"]],
        outputs,
        show_progress="minimal",
        show_progress_on=[status],
    )
    shown = [status, tokens, answer, growth, gauge, check, waste, download_npz, download_csv]
    clear_on_refusal(checked, shown)  # only the check's refusal: a run ended by Stop keeps its results

    event.success(
        lambda trace, conversation, multi: generate_chat.after_turn(ctx, trace, conversation, multi),
        [ctx.trace_state, chat_ui["state"], chat_ui["multi"]],
        chat_ui["views"],
        queue=False,
        api_name=False,
        show_progress="hidden",
    )

    def stop(request: gr.Request):
        ctx.stop_flag(request).set()

    # on ZeroGPU the run is in a forked worker that never sees the flag: Stop cancels the call, which ends it
    cancels = [event] if ctx.settings.zero_gpu else None
    stop_btn.click(stop, None, None, queue=False, api_name=False, cancels=cancels)
    step.change(replay, [ctx.trace_state, step], [tokens, growth], api_name=False, show_progress="hidden")

    generate_run.api_generate_job.api(ctx, api_name="generate")
    generate_run.api_chat_job.api(ctx, api_name="chat")

    def api_engine() -> dict:
        """The engine's counters (runs submitted and shared, forwards, largest batch) and its prefix
        cache (blocks, bytes held, hit rate): what the room's requests shared."""
        return ctx.engine.snapshot()

    gr.api(api_engine, api_name="engine", queue=False)
    return event


def replay(trace, step):
    """The token strip and cache growth as they were after decode step ``step`` of the session's run."""
    if trace is None:
        return gr.skip(), gr.skip()
    with user_errors():
        upto = whole_number(step or 0, "Step", 0, MAX_STEP)
    return fig.token_spans(trace, upto), fig.cache_growth(trace, upto=upto)
