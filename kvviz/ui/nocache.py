"""Cache vs no cache tab: the article's redundant-work table for your prompt, and both loops timed on the model."""

from __future__ import annotations

import gradio as gr

from kvviz.capture.model_io import encode_prompt
from kvviz.demo_store import Compute
from kvviz.figures import nocache as fig
from kvviz.lessons.nocache import compare_cache, table_for_prompt
from kvviz.safety import whole_number
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.gpu import gpu
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.precompute import live_box, origin, shared
from kvviz.ui.serving.sessions import user_errors
from kvviz.units import plural

MAX_N = 64  # the no-cache loop is quadratic: keep the live demo short
MAX_PROMPT = 512
DEFAULT_PROMPT = "Once upon a time"
REGIME = (
    "Why short runs hide it: every forward pays a fixed cost (launching the model's ~30 layers, reading "
    "its weights) whether it re-runs 5 tokens or 1, so with a few-token prompt both loops take about "
    "the same time; the quadratic waste shows once the prompt is hundreds of tokens (paste a few "
    "paragraphs, or use the Learn tab's “Time both loops”, which loads a ~300-token passage)."
)


def _ids(ctx: AppContext, prompt, chat) -> list[int]:
    if prompt is None or not str(prompt).strip():
        raise UserError("The prompt is empty: type some text, e.g. “Once upon a time”.")
    ids = encode_prompt(ctx.lm, str(prompt), bool(chat))
    limit = min(MAX_PROMPT, ctx.settings.max_prompt_tokens)
    if len(ids) > limit:
        raise UserError(
            f"The prompt is {len(ids):,} tokens; the no-cache loop re-runs it every step, so this view "
            f"takes at most {limit:,}. Shorten it."
        )
    return ids


def _whole(value, what: str, lo: int, hi: int) -> int:
    with user_errors():
        return whole_number(value, what, lo, hi)  # refuses NaN, infinities, fractions and text


def table(ctx: AppContext, prompt, chat, steps):
    """The redundant-work table with the real tokenizer and the model's own continuation."""
    _ids(ctx, prompt, chat)
    n = _whole(steps, "Steps", 1, 16)
    with user_errors():
        return table_for_prompt(ctx.lm, str(prompt), n, bool(chat))


def measure(ctx: AppContext, prompt, chat, new_tokens, progress=gr.Progress()):
    """Generate N tokens both ways; plots of time and passes vs N, and whether the tokens are identical."""
    ids = _ids(ctx, prompt, chat)
    n = _whole(new_tokens, "N", 1, min(MAX_N, ctx.settings.max_new_tokens))
    progress(0.0, desc="With the cache")
    cmp = compare_cache(ctx.lm, str(prompt), n, bool(chat), ids=ids, progress=lambda f, desc: progress(f, desc=desc))
    return present(cmp, "measured now on this machine")


def present(cmp, when: str):
    """Plots, summary and numbers of a finished comparison; ``when`` says where and when it was timed."""
    n = cmp.new_tokens
    df = cmp.frame()
    last = df.iloc[-1]
    same = (
        "**Same tokens:** yes — greedy decoding with and without the cache produced the identical "
        f"{plural(n, 'token')}."
        if cmp.same_tokens
        else "**Same tokens: no** — the two loops disagreed (a near-tie in fp arithmetic); see the table."
    )
    text = (
        f"{same} Prompt: {cmp.prompt_tokens} tokens. To generate N = {n}: **{int(last['passes with cache']):,}** "
        f"token-forward passes with the cache vs **{int(last['passes without cache']):,}** without "
        f"({last['passes without cache'] / last['passes with cache']:.1f}×); "
        f"**{last['time with cache (s)']:.2f} s** vs **{last['time without cache (s)']:.2f} s** ({cmp.speedup:.1f}×), "
        f"{when}. {REGIME}"
    )
    return fig.time_vs_n(cmp), fig.passes_vs_n(cmp), text, df.round(4)


def build(ctx: AppContext) -> None:
    """Build the tab inside the caller's ``gr.Tab``."""
    gr.Markdown(
        "Why the cache exists. Without it, every step re-runs the whole sequence and recomputes keys and "
        "values that cannot have changed (position *i* attends only to positions ≤ *i*)."
    )
    with gr.Row():
        prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, scale=3, elem_id="nocache-prompt")
        with gr.Column(scale=2):
            chat = gr.Checkbox(value=False, label="Use the chat template")
            steps = gr.Slider(1, 16, value=4, step=1, label="Table steps", elem_id="nocache-steps")
    table_btn = gr.Button("Build the table", elem_id="nocache-table-btn")
    tbl = gr.Dataframe(
        waiting_table("Press Build the table to see the repeated work for your prompt"),
        label="Repeated work without a cache",
        interactive=False,
        wrap=True,
        elem_id="nocache-table",
    )
    gr.Markdown(fig.CAPTIONS["table"], elem_classes="caption")
    gr.Markdown(fig.chapter_text(), elem_id="nocache-chapter")
    with gr.Row():
        new_tokens = gr.Slider(
            1,
            min(MAX_N, ctx.settings.max_new_tokens),
            value=min(32, ctx.settings.max_new_tokens),
            step=1,
            label="N (tokens to generate)",
            elem_id="nocache-n",
        )
        with gr.Column():
            run_btn = gr.Button("Generate with and without the cache", variant="primary", elem_id="nocache-run")
            live = live_box("nocache-live")
    gr.Markdown(REGIME, elem_classes="caption")
    summary = gr.Markdown(elem_id="nocache-summary")
    with gr.Row():
        time_plot = captioned_plot("Time vs N", "nocache-time", fig.CAPTIONS["time"])
        passes_plot = captioned_plot("Passes vs N", "nocache-passes", fig.CAPTIONS["passes"])
    with gr.Accordion("Per-N numbers", open=False):
        numbers = gr.Dataframe(
            waiting_table("Press Generate with and without the cache to see the numbers per N"),
            interactive=False,
            elem_id="nocache-numbers",
        )

    ctx.components.update(
        {
            "nocache.prompt": prompt,
            "nocache.chat": chat,
            "nocache.steps": steps,
            "nocache.table_button": table_btn,
            "nocache.new_tokens": new_tokens,
            "nocache.button": run_btn,
        }
    )

    def run_table(p, c, s, request: gr.Request):
        n = _whole(s, "Table steps", 1, 16)
        with ctx.jobs.start_prompt(request, "no-cache table", ctx.lm, p, c, n, runs=2):
            return table(ctx, p, c, n)

    def job(p, c, n: int) -> tuple[tuple, Compute]:
        """The store key and computation of one timing (the prompt checked and tokenized first)."""
        ids = _ids(ctx, p, c)
        n = _whole(n, "N", 1, min(MAX_N, ctx.settings.max_new_tokens))

        def compute(report, should_stop):
            return compare_cache(ctx.lm, str(p), n, bool(c), ids=ids, progress=report)

        return (ctx.lm.name, "nocache", tuple(ids), bool(c), n), compute

    def plan(values: dict) -> tuple:
        key, compute = job(
            *[
                values.get(k, c.value)
                for k, c in (("nocache.prompt", prompt), ("nocache.chat", chat), ("nocache.new_tokens", new_tokens))
            ]
        )
        ctx.store.plan(key, "cache vs no-cache timing", compute)
        return key

    ctx.planners["nocache.button"] = plan

    def run_measure(p, c, n, fresh, request: gr.Request, progress=gr.Progress()):
        key, compute = job(p, c, n)
        cmp, entry = shared(
            ctx,
            request,
            key,
            compute,
            live=bool(fresh),
            what="cache vs no-cache timing",
            cost=(len(key[2]), key[4]),
            runs=2 + key[4] // 4,
            progress=lambda f, d: progress(f, desc=d),
        )
        when = "measured now on this machine" if entry is None else f"measured on this machine, {origin(entry)}"
        return present(cmp, when.replace("computed ", ""))

    table_btn.click(gpu(run_table), [prompt, chat, steps], tbl, api_name=False, concurrency_limit=None)
    measured = run_btn.click(
        gpu(run_measure),
        [prompt, chat, new_tokens, live],
        [time_plot, passes_plot, summary, numbers],
        api_name=False,
        concurrency_limit=None,
    )
    clear_on_refusal(measured, [summary, time_plot, passes_plot])
