"""Memory tab section: the cache of every architecture, live, on tiny random-weight models.

Pick MHA, GQA, MQA, MLA, sliding, hybrid, learned-sink, KV-sharing (Gemma-4), DSA (DeepSeek-V3.2) or a
linear hybrid (Qwen3-Next); :func:`kvviz.capture.architectures.run_kind` runs a prompt through a tiny model
of that kind (a few seconds) and :mod:`kvviz.figures.architectures` draws its real cache next to the formula. This module only validates input and wires events.
"""

from __future__ import annotations

import gradio as gr

from kvviz.capture.architectures import DEFAULT_PROMPT, MAX_PROMPT_BYTES, kinds, run_kind
from kvviz.figures import architectures as fig
from kvviz.ui.page.widgets import captioned_plot, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.sessions import user_errors


def show_architecture(kind, prompt):
    """(summary, per-layer table, chart, bytes-per-step chart, recorded attention) for one kind and prompt."""
    if kind not in kinds():
        raise gr.Error(f"Pick one of the architectures: {', '.join(kinds())}.")
    if not isinstance(prompt, str) or not prompt.strip():
        raise gr.Error("Type a short prompt for the tiny model (a few words).")
    if len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
        raise gr.Error(f"The tiny models read at most {MAX_PROMPT_BYTES} bytes; shorten the prompt.")
    with user_errors("Tiny-model run"):
        live = run_kind(kind, prompt)
    charts = fig.bytes_chart(live), fig.steps_chart(live), fig.attention_chart(live)
    return fig.summary_markdown(live), fig.cache_table(live), *charts


def build(ctx: AppContext) -> None:
    """The section, inside the Memory tab."""
    gr.Markdown(
        "### The cache of every architecture, live\nA tiny random-weight model of the architecture you "
        "pick (config shipped with kvviz, nothing downloaded) reads your prompt byte by byte; below are "
        "the tensors transformers really keeps in its cache, next to the formula."
    )
    with gr.Row():
        kind = gr.Radio(kinds(), value="MLA", label="Architecture", elem_id="arch-kind")
        prompt = gr.Textbox(
            DEFAULT_PROMPT, label="Prompt (UTF-8 bytes are the tokens)", max_lines=1, elem_id="arch-prompt"
        )
        button = gr.Button("Run the tiny model", elem_id="arch-run")
    summary = gr.Markdown(
        "Press **Run the tiny model** (or pick an architecture) to read its cache.", elem_id="arch-summary"
    )
    table = gr.Dataframe(
        waiting_table("Press Run the tiny model to see its cache tensors, layer by layer"),
        label="Cache tensors per layer",
        interactive=False,
        elem_id="arch-table",
    )
    gr.Markdown(fig.CAPTIONS["table"], elem_classes="caption")
    chart = captioned_plot("Bytes per layer", "arch-chart", fig.CAPTIONS["chart"])
    steps = captioned_plot("Bytes per layer, step by step", "arch-steps", fig.CAPTIONS["steps"])
    attention = captioned_plot("Attention recorded", "arch-attention", fig.CAPTIONS["attention"])
    ctx.components.update({"memory.arch_kind": kind, "memory.arch_run": button})
    gr.on(
        [button.click, kind.change, prompt.submit],
        show_architecture,
        [kind, prompt],
        [summary, table, chart, steps, attention],
        api_name=False,
        concurrency_id="tiny",
        concurrency_limit=ctx.settings.concurrency,
    )
