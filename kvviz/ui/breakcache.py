"""Break the cache tab: switch on one real KV-cache bug in kvviz's own decoding, then see where the run first
leaves its full recomputation (the layer × step map), its tokens beside the correct run's, and the fix.

The library does the work (:func:`kvviz.capture.divergence.debug`, the zoo in ``kvviz/capture/faults/``);
this module checks the inputs, runs it through the model-job wrapper and draws
(:mod:`kvviz.figures.debugger`). The fault changes only the visitor's own run. Endpoint: ``/break_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from kvviz.capture.divergence import Report, debug, verdict
from kvviz.capture.faults import FAULTS, Fault, check_fault, make_fault
from kvviz.demo_store import Compute
from kvviz.examples import CHAT_QUESTION
from kvviz.figures import debugger as fig
from kvviz.limits import MAX_DEBUG_NEW_TOKENS
from kvviz.safety import whole_number
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob, prompt_ids
from kvviz.ui.serving.precompute import live_box, origin, shared
from kvviz.ui.serving.sessions import user_errors

NONE = "none"
DEFAULT_PROMPT = CHAT_QUESTION
DEFAULT_NEW = 8
CHOICES = [("none — the correct cache (all clear)", NONE)] + [(f.title, name) for name, f in FAULTS.items()]


def break_cache(
    ctx: AppContext,
    fault: str = NONE,
    step: int = 2,
    layer: int = 0,
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = DEFAULT_NEW,
    block: int = 1,
) -> BreakAsk:
    """Where a cached run with one KV-cache bug switched on first leaves its full recomputation.

    Args:
        fault: the bug to switch on in kvviz's own cached decoding: none, causal_decode, not_appended,
            appended_twice, rope_off_by_one, gqa_wrong_group, fp8_no_scales, prefix_block_off_by_one,
            fully_cached_prompt or sliding_window_off_by_one (never in the reference).
        step: the decode step the fault strikes first, a whole number from 1 (0 is the prefill).
        layer: the layer it strikes, a whole number from 0.
        prompt: the prompt, in plain text (wrapped in the model's chat template).
        max_new_tokens: tokens to generate greedily, a whole number from 2.
        block: prefix_block_off_by_one only: the first 8-token prompt block the table maps wrongly.

    Returns:
        The first (step, layer, KV head, position) beyond the dtype's tolerance and what left it, whether the
        tokens changed and from which step, the layer × step map, the tokens beside a correct run's, the lesson.
    """
    name = str(fault or NONE)
    with user_errors():
        n = whole_number(
            max_new_tokens, "Tokens to generate", 2, min(MAX_DEBUG_NEW_TOKENS, ctx.settings.max_new_tokens)
        )
        s = whole_number(step, "Fault step", 1, n - 1)
        lay = whole_number(layer, "Fault layer", 0, ctx.info.layers - 1)
        b = whole_number(block, "Fault block", 1, 4096)
        made = None if name == NONE else make_fault(name, s, lay, b)
        if made is not None:
            check_fault(made, ctx.info.layers, n, ctx.info.sliding_window is not None)
    text, ids = prompt_ids(ctx, prompt, True, n)
    return BreakAsk(made, text, tuple(ids), n)


@dataclass(frozen=True)
class BreakAsk:
    """A checked debugger run: the fault (None: the correct cache), the prompt and its ids, the new tokens,
    and *Recompute live* (the tab's box; the endpoint never recomputes a stored result)."""

    fault: Fault | None
    text: str
    ids: tuple
    n_new: int
    fresh: bool = False


@dataclass(frozen=True)
class Shown:
    """What the tab shows of a report: the map, the verdict (what went wrong and the fix), the tokens."""

    map: go.Figure
    text: str
    tokens: pd.DataFrame


def _size(a: BreakAsk) -> Size:
    return Size(len(a.ids), a.n_new, runs=3)  # the broken run, a correct run, one recomputation


def _debug(ctx: AppContext, a: BreakAsk) -> Report:
    return debug(ctx.lm, a.text, a.fault, max_new_tokens=a.n_new, prompt_ids=list(a.ids), clean=True)


def compute_for(ctx: AppContext, a: BreakAsk) -> Compute:
    def compute(report, should_stop) -> Report:
        with user_errors():
            return _debug(ctx, a)

    return compute


def key_of(ctx: AppContext, a: BreakAsk) -> tuple:
    made = a.fault
    where = None if made is None else (made.name, made.step, made.layer, getattr(made, "block", None))
    return ctx.lm.name, "break_cache", where, a.ids, a.n_new


def present(report: Report, when: str) -> Shown:
    """The map, the verdict (what went wrong and the fix) and the tokens side by side."""
    j = report.to_json()
    title = j["fault"]["title"] if j["fault"] else ""
    head = "**All clear.**" if report.first is None else f"**{title[:1].upper()}{title[1:]}.**" if title else ""
    text = f"{head} {verdict(j)}".replace("\n", " ") + f" _({when})_"
    return Shown(fig.divergence_map(report), text, fig.tokens_table(report))


def shown(views: list, s: Shown) -> dict:
    """``s`` in the tab's views: the map, the verdict and the tokens, by component."""
    plot, summary, tokens = views
    return {plot: s.map, summary: s.text, tokens: s.tokens}


def _api_run(job) -> dict:
    return _debug(job.ctx, job.req).to_json()


# the ``/break_cache`` endpoint (and ``api_break_cache(ctx, …)`` in tests)
api_break_cache = ModelJob("cache debugger", check=break_cache, run=_api_run, size=_size)


def _show_mes(ctx: AppContext, inputs: list, live: gr.Checkbox, views: list) -> None:
    """Learn's show-mes (objective 2): plan their runs on the store, answer from it in the show-me's own click
    (``views``: the map, the verdict and the tokens), and read their "Look for" line from it."""
    names = ["breakcache.fault", "breakcache.step", "breakcache.layer", "breakcache.prompt", "breakcache.new_tokens"]

    def request(values: dict) -> BreakAsk:
        return break_cache(ctx, *[values.get(k, c.value) for k, c in zip([*names, "breakcache.block"], inputs)])

    def plan(values: dict) -> tuple:
        req = request(values)
        ctx.store.plan(key_of(ctx, req), "break the cache", compute_for(ctx, req))
        return key_of(ctx, req)

    def stored(req: BreakAsk):
        entry = ctx.store.entry(key_of(ctx, req))
        return entry if entry is not None and entry.state == "done" else None

    def answer(_request, *values) -> dict | None:
        """The tab's views of the stored run for these settings (None: not stored, or *Recompute live* ticked)."""
        *raw, fresh = values
        entry = None if fresh else stored(break_cache(ctx, *raw))
        return None if entry is None else shown(views, present(entry.value, origin(entry)))

    def look_for(values: dict) -> str | None:
        entry = stored(request(values))
        return None if entry is None else fig.look_for(entry.value)

    ctx.planners["breakcache.button"] = plan
    ctx.answers["breakcache.button"] = ShowMeAnswer([*inputs, live], views, answer)
    ctx.look_fors["breakcache.button"] = look_for


def build(ctx: AppContext) -> None:
    """Build the tab inside the caller's ``gr.Tab``."""
    gr.Markdown(
        "Break the cache on purpose. Pick a real KV-cache bug, run, and kvviz recomputes the whole sequence "
        "from scratch to find the first step, layer, KV head and position where the cached run leaves it. "
        "The bug changes only your run."
    )
    with gr.Row():
        fault = gr.Dropdown(CHOICES, value=NONE, label="Fault", elem_id="breakcache-fault", scale=2)
        step = gr.Slider(
            1, MAX_DEBUG_NEW_TOKENS - 1, value=2, step=1, label="Step it strikes", elem_id="breakcache-step"
        )
        layer = gr.Slider(0, ctx.info.layers - 1, value=0, step=1, label="Layer it strikes", elem_id="breakcache-layer")
        block = gr.Slider(1, 16, value=1, step=1, label="Block (prefix faults)", elem_id="breakcache-block")
    with gr.Row():
        prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=1, scale=3, elem_id="breakcache-prompt")
        new = gr.Slider(2, MAX_DEBUG_NEW_TOKENS, value=DEFAULT_NEW, step=1, label="Tokens", elem_id="breakcache-new")
        with gr.Column():
            run_btn = gr.Button("Run and find the divergence", variant="primary", elem_id="breakcache-run")
            live = live_box("breakcache-live")
    summary = gr.Markdown(elem_id="breakcache-verdict")
    with gr.Row():
        with gr.Column(scale=3):
            plot = captioned_plot("Divergence map", "breakcache-map", fig.CAPTIONS["map"])
        with gr.Column(scale=2):
            tokens = gr.Dataframe(
                waiting_table("Press Run to see the tokens beside the correct run's"),
                label="Tokens",
                interactive=False,
                elem_id="breakcache-tokens",
            )
            gr.Markdown(fig.CAPTIONS["tokens"], elem_classes="caption")
    ctx.components.update(
        {
            "breakcache.fault": fault,
            "breakcache.step": step,
            "breakcache.layer": layer,
            "breakcache.block": block,
            "breakcache.prompt": prompt,
            "breakcache.new_tokens": new,
            "breakcache.button": run_btn,
        }
    )
    inputs = [fault, step, layer, prompt, new, block]
    _show_mes(ctx, inputs, live, [plot, summary, tokens])

    def run(job) -> dict:
        a: BreakAsk = job.req
        report, entry = shared(job, key_of(ctx, a), compute_for(ctx, a), live=a.fresh)
        return shown([plot, summary, tokens], present(report, "computed now" if entry is None else origin(entry)))

    job = ModelJob(
        "cache debugger",
        check=lambda _ctx, f, s, lay, p, n, b, fresh: replace(break_cache(ctx, f, s, lay, p, n, b), fresh=bool(fresh)),
        run=run,
        size=_size,
        store=True,
    )
    ran = job.event(ctx, run_btn.click, [*inputs, live], [plot, summary, tokens])
    clear_on_refusal(ran, [summary, plot])
    api_break_cache.api(ctx, api_name="break_cache")
