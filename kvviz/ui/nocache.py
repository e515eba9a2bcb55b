"""Cache vs no cache tab: the article's redundant-work table for your prompt, and both loops timed on the model."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import pandas as pd

from kvviz.capture.model_io import encode_prompt
from kvviz.demo_store import Compute
from kvviz.figures import nocache as fig
from kvviz.lessons.nocache import DRAMATIC, compare_cache, table_for_prompt
from kvviz.lessons.objectives import NOCACHE
from kvviz.safety import whole_number
from kvviz.ui.page.first_sight import Example, once
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.model_job import ModelJob, prompt_ids
from kvviz.ui.serving.precompute import live_box, origin, shared
from kvviz.ui.serving.sessions import user_errors
from kvviz.units import plural

MAX_N = 64  # the no-cache loop is quadratic: keep the live demo short
MAX_PROMPT = 512
DEFAULT_PROMPT = "Once upon a time"
REGIME = (
    "Why short runs hide it: every forward pays a fixed cost (launching the model's ~30 layers, reading "
    "its weights) whether it re-runs 5 tokens or 1, so with a few-token prompt both loops take about "
    "the same time; the waste shows in time once the prompt is hundreds of tokens (paste a few "
    "paragraphs, or press “" + DRAMATIC.label + "”, which loads a ~300-token passage and runs both loops)."
)
RUN_JS = """() => {
  setTimeout(() => {
    const el = document.getElementById('nocache-run');
    if (el) (el.tagName === 'BUTTON' ? el : (el.querySelector('button') || el)).click();
  }, 300);
  return [];
}"""  # after the dramatic setting is filled in, press the run button as a user would


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


def measure(ctx: AppContext, prompt, chat, new_tokens, progress=gr.Progress()) -> Timing:
    """Generate N tokens both ways; plots of time and passes vs N, and whether the tokens are identical."""
    ids = _ids(ctx, prompt, chat)
    n = _whole(new_tokens, "N", 1, min(MAX_N, ctx.settings.max_new_tokens))
    progress(0.0, desc="With the cache")
    cmp = compare_cache(ctx.lm, str(prompt), n, bool(chat), ids=ids, progress=lambda f, desc: progress(f, desc=desc))
    return present(cmp, "measured now on this machine")


@dataclass
class Timing:
    """What a finished comparison shows: both charts, the summary and the per-N numbers."""

    time_fig: object
    passes_fig: object
    text: str
    numbers: pd.DataFrame


def present(cmp, when: str) -> Timing:
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
    return Timing(fig.time_vs_n(cmp), fig.passes_vs_n(cmp), text, df.round(4))


def shown(cmp, entry) -> Timing:
    """A comparison from the store (``entry``) or computed now (None), saying which."""
    when = "measured now on this machine" if entry is None else f"measured on this machine, {origin(entry)}"
    return present(cmp, when.replace("computed ", ""))


@dataclass
class _Views:
    """Every component of the tab, by name."""

    prompt: gr.Textbox
    chat: gr.Checkbox
    steps: gr.Slider
    table_btn: gr.Button
    table: gr.Dataframe
    new_tokens: gr.Slider
    run_btn: gr.Button
    dramatic: gr.Button
    live: gr.Checkbox
    example: gr.Markdown
    summary: gr.Markdown
    time_plot: gr.Plot
    passes_plot: gr.Plot
    numbers: gr.Dataframe

    def timing(self, t: Timing) -> dict:
        return {
            self.time_plot: t.time_fig,
            self.passes_plot: t.passes_fig,
            self.summary: t.text,
            self.numbers: t.numbers,
        }


def build(ctx: AppContext) -> None:
    """Build the tab inside the caller's ``gr.Tab``: its layout, then its wiring."""
    _wire(ctx, _layout(ctx))


def _layout(ctx: AppContext) -> _Views:
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
            dramatic = gr.Button(DRAMATIC.label, elem_id="nocache-dramatic")
            live = live_box("nocache-live")
    gr.Markdown(REGIME, elem_classes="caption")
    example = gr.Markdown(elem_id="nocache-example")
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
    return _Views(
        prompt, chat, steps, table_btn, tbl, new_tokens, run_btn, dramatic, live, example, summary, time_plot,
        passes_plot, numbers,
    )  # fmt: skip


@dataclass(frozen=True)
class TableAsk:
    """A checked no-cache table: the prompt, chat or not, the steps tabulated, the prompt's length in tokens."""

    prompt: str
    chat: bool
    steps: int
    n_prompt: int


@dataclass(frozen=True)
class TimingAsk:
    """A checked timing: the prompt's length in tokens, N, the store key and computation, *Recompute live*."""

    n_prompt: int
    n_new: int
    key: tuple
    compute: Compute
    fresh: bool


def _wire(ctx: AppContext, v: _Views) -> None:
    """Register the tab's inputs and show-me plans, and wire its buttons and its first open."""
    ctx.components.update(
        {
            "nocache.prompt": v.prompt,
            "nocache.chat": v.chat,
            "nocache.steps": v.steps,
            "nocache.table_button": v.table_btn,
            "nocache.new_tokens": v.new_tokens,
            "nocache.button": v.run_btn,
        }
    )

    def run_table(job) -> dict:
        a: TableAsk = job.req
        return {v.table: table(ctx, a.prompt, a.chat, a.steps)}

    def table_request(_ctx, p, c, s) -> TableAsk:
        n = _whole(s, "Table steps", 1, 16)
        return TableAsk(p, c, n, len(prompt_ids(ctx, p, c, n)[1]))

    table_run = ModelJob(
        "no-cache table", check=table_request, run=run_table, size=lambda a: Size(a.n_prompt, a.steps, runs=2)
    )

    def job(p, c, n: int, fresh: bool = False) -> TimingAsk:
        """One timing: the prompt checked and tokenized first, then its store key and computation."""
        ids = _ids(ctx, p, c)
        n = _whole(n, "N", 1, min(MAX_N, ctx.settings.max_new_tokens))

        def compute(report, should_stop):
            return compare_cache(ctx.lm, str(p), n, bool(c), ids=ids, progress=report)

        return TimingAsk(len(ids), n, (ctx.lm.name, "nocache", tuple(ids), bool(c), n), compute, bool(fresh))

    controls = {"nocache.prompt": v.prompt, "nocache.chat": v.chat, "nocache.new_tokens": v.new_tokens}

    def plan(values: dict) -> tuple:
        a = job(*[values.get(k, c.value) for k, c in controls.items()])
        ctx.store.plan(a.key, "cache vs no-cache timing", a.compute)
        return a.key

    ctx.planners["nocache.button"] = plan

    def run_measure(running) -> dict:
        a: TimingAsk = running.req
        return v.timing(shown(*shared(running, a.key, a.compute, live=a.fresh)))

    measure_run = ModelJob(
        "cache vs no-cache timing",
        check=lambda _ctx, p, c, n, fresh: job(p, c, n, fresh),
        run=run_measure,
        size=lambda a: Size(a.n_prompt, a.n_new, runs=2 + a.n_new // 4),
        store=True,
        progress=True,
    )
    timing = [v.time_plot, v.passes_plot, v.summary, v.numbers]
    table_run.event(ctx, v.table_btn.click, [v.prompt, v.chat, v.steps], [v.table])
    measured = measure_run.event(ctx, v.run_btn.click, [v.prompt, v.chat, v.new_tokens, v.live], timing)
    clear_on_refusal(measured, [v.summary, v.time_plot, v.passes_plot])
    dramatic = {v.prompt: DRAMATIC.prompt, v.chat: DRAMATIC.chat, v.new_tokens: DRAMATIC.new_tokens}
    v.dramatic.click(lambda: dramatic, None, list(dramatic), api_name=False, queue=False).then(
        None, None, None, js=RUN_JS
    )
    ctx.examples["tab_nocache"] = (
        Example(
            what=f"both loops timed on a ~300-token chapter passage, N = {DRAMATIC.new_tokens}",
            change="change the prompt or N and press **Generate with and without the cache**",
            key=once(lambda: plan(NOCACHE.values)),
            draw=lambda cmp, entry, request: v.timing(shown(cmp, entry)),
            outputs=timing,
            values=dramatic,
        ),
        v.example,
    )
