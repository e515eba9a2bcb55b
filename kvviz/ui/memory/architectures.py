"""Memory tab section: the cache of every architecture, live, on tiny random-weight models.

Pick MHA, GQA, MQA, MLA, sliding, hybrid, learned-sink, KV-sharing (Gemma-4), DSA (DeepSeek-V3.2) or a
linear hybrid (Qwen3-Next); :func:`kvviz.capture.architectures.run_kind` runs a prompt through a tiny model
of that kind (a few seconds) and :mod:`kvviz.figures.architectures` draws its real cache next to the formula. This module only validates input and wires events.
The kinds the Learn tab's show-mes open are computed at start-up and stored (``ctx.store``), with the
"Look for" line read from that result.
"""

from __future__ import annotations

import gradio as gr

from kvviz.capture.architectures import DEFAULT_PROMPT, MAX_PROMPT_BYTES, LiveCache, kinds, run_kind
from kvviz.figures import architectures as fig
from kvviz.ui.page.widgets import captioned_plot, waiting_table
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.sessions import user_errors


def _key(ctx: AppContext, kind: str, prompt: str) -> tuple:
    return ctx.lm.name, "architecture", kind, prompt


def stored(ctx: AppContext | None, kind, prompt) -> LiveCache | None:
    """The run of ``kind`` on ``prompt`` computed at start-up, if it is ready."""
    entry = None if ctx is None else ctx.store.entry(_key(ctx, kind, prompt))
    return entry.value if entry is not None and entry.state == "done" else None


def views(live: LiveCache) -> tuple:
    charts = fig.bytes_chart(live), fig.steps_chart(live), fig.attention_chart(live)
    return fig.summary_markdown(live), fig.cache_table(live), *charts


def show_architecture(kind, prompt, ctx: AppContext | None = None):
    """(summary, per-layer table, chart, bytes-per-step chart, recorded attention) for one kind and prompt
    (the stored run when ``ctx``'s store holds it)."""
    if kind not in kinds():
        raise gr.Error(f"Pick one of the architectures: {', '.join(kinds())}.")
    if not isinstance(prompt, str) or not prompt.strip():
        raise gr.Error("Type a short prompt for the tiny model (a few words).")
    if len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
        raise gr.Error(f"The tiny models read at most {MAX_PROMPT_BYTES} bytes; shorten the prompt.")
    live = stored(ctx, kind, prompt)
    if live is None:
        with user_errors("Tiny-model run"):
            live = run_kind(kind, prompt)
    return views(live)


def _plan(ctx: AppContext, kind: gr.Radio) -> None:
    """Show-mes: plan their kinds' runs on the store, answer from it, and read their "Look for" line from it."""

    def values_of(values: dict) -> tuple[str, str]:
        return values.get("memory.arch_kind", kind.value), values.get("memory.arch_prompt", DEFAULT_PROMPT)

    def plan(values: dict) -> tuple:
        k, p = values_of(values)
        ctx.store.plan(_key(ctx, k, p), f"tiny {k} model", lambda report, should_stop: run_kind(k, p))
        return _key(ctx, k, p)

    def look_for(values: dict) -> str | None:
        live = stored(ctx, *values_of(values))
        return None if live is None else fig.look_for(live)

    ctx.planners["memory.arch_run"] = plan
    ctx.look_fors["memory.arch_run"] = look_for


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
    ctx.components.update({"memory.arch_kind": kind, "memory.arch_prompt": prompt, "memory.arch_run": button})
    outputs = [summary, table, chart, steps, attention]
    _plan(ctx, kind)
    ctx.answers["memory.arch_run"] = ShowMeAnswer(
        [kind, prompt], outputs, lambda request, k, p: None if (live := stored(ctx, k, p)) is None else views(live)
    )
    gr.on(
        [button.click, kind.change, prompt.submit],
        lambda k, p: show_architecture(k, p, ctx),
        [kind, prompt],
        outputs,
        api_name=False,
        concurrency_id="tiny",
        concurrency_limit=ctx.settings.concurrency,
    )
