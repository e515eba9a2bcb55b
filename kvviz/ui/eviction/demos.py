"""Eviction tab section: the two demos — a needle SnapKV keeps and StreamingLLM loses, and why sinks matter.

Both are computed once when the server starts (:mod:`kvviz.ui.serving.precompute`), so their buttons and the
Learn tab's show-mes answer at once; *Recompute live* runs them again. The needle demo fills the
tab's form with its settings and shows its SnapKV run and its comparison where the tab shows its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from kvviz.eviction.demos import (
    NEEDLE_BUDGET,
    NEEDLE_FILLER,
    NEEDLE_POLICIES,
    SINKS_CACHE,
    SINKS_TOKENS,
    needle_demo,
    sinks_demo,
)
from kvviz.examples import NEEDLE_ANSWER, NEEDLE_QUESTION, needle_passage
from kvviz.figures import eviction as eviction_fig
from kvviz.figures import eviction_compare as fig
from kvviz.lessons.objectives import NEEDLE
from kvviz.ui.eviction import compare as eviction_compare
from kvviz.ui.eviction.request import COMPRESS_CONTEXT, NEEDLE_TOKENS, library_call
from kvviz.ui.page.first_sight import Example, once
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.precompute import live_box, origin, shared


@dataclass(frozen=True)
class NeedleAsk:
    """A checked needle demo: what is compressed (the context, or the context and question), *Recompute live*."""

    compress: str
    live: bool


@dataclass
class DemosSection:
    """The demos' buttons, their "recompute live" box and the sinks demo's outputs."""

    needle: gr.Button
    sinks: gr.Button
    live: gr.Checkbox
    sinks_text: gr.Markdown
    sinks_plot: gr.Plot


def layout() -> DemosSection:
    """The heading, both buttons, one sentence on each demo, and the sinks demo's result."""
    gr.Markdown("### Demos")
    with gr.Row():
        needle = gr.Button(f"Needle: who keeps the code {NEEDLE_ANSWER}?", elem_id="evict-needle")
        sinks = gr.Button("Sinks matter: perplexity with and without the first 4 tokens", elem_id="evict-sinks")
    live = live_box("evict-demo-live")
    gr.Markdown(
        f"**Needle** compares the full cache, StreamingLLM and SnapKV at {NEEDLE_BUDGET} kept tokens on a "
        "passage with one fact in the middle; switch *What is compressed* to see SnapKV lose the fact when "
        f"the question cannot vote. **Sinks matter** scores {SINKS_TOKENS} tokens of the chapter with a "
        f"{SINKS_CACHE}-entry cache. Both are computed once when the server starts; tick *Recompute live* to run "
        f"them again now (a minute on a CPU). {eviction_fig.LEADERBOARD_NOTE}",
        elem_classes="caption",
    )
    sinks_text = gr.Markdown(elem_id="evict-sinks-result")
    sinks_plot = gr.Plot(label="Sinks matter", elem_id="evict-sinks-plot")
    gr.Markdown(fig.CAPTIONS["sinks"], elem_classes="caption")
    return DemosSection(needle, sinks, live, sinks_text, sinks_plot)


@dataclass(frozen=True)
class NeedleTargets:
    """Where the needle demo lands in the tab, by name: the form boxes its settings go into (``form``, by
    the needle's setting: prompt, question, chat, policy, mode, budget), how the tab shows one policy run
    (``show_run(result, policy)`` → ``{component: value}``, as after *Run policy*), and every component
    that may write (``outputs``: the wiring's set)."""

    form: dict[str, gr.components.Component]
    show_run: Callable[..., dict]
    outputs: list


def wire(
    ctx: AppContext,
    section: DemosSection,
    compress: gr.Radio,
    targets: NeedleTargets,
    comparison: eviction_compare.CompareSection,
    line: gr.Markdown,
) -> None:
    """Plan both demos, register them for the Learn tab and as the tab's first-open example (named in ``line``),
    and wire their buttons: the needle demo fills the tab's form and run views (``targets``) and the
    comparison section."""

    def needle_key(comp) -> tuple:
        return ctx.lm.name, "needle", comp != COMPRESS_CONTEXT

    def needle_job(comp):
        def compute(report, should_stop):
            return library_call(
                lambda: needle_demo(ctx.lm, compress_question=comp != COMPRESS_CONTEXT, progress=report),
                what="Needle demo",
            )

        return compute

    def plan_needle(values: dict) -> tuple:
        comp = values.get("eviction.compress", compress.value)
        ctx.store.plan(needle_key(comp), "needle demo", needle_job(comp))
        return needle_key(comp)

    ctx.planners["eviction.needle"] = plan_needle
    plan_needle({})

    settings = dict(
        prompt=needle_passage(*NEEDLE_FILLER),
        question=f"Question: {NEEDLE_QUESTION}",
        chat=True,
        policy="snapkv",
        mode="tokens",
        budget=NEEDLE_BUDGET,
    )

    def run_needle(job) -> dict:
        a: NeedleAsk = job.req
        res, entry = shared(job, needle_key(a.compress), needle_job(a.compress), live=a.live)
        snap = next(r for r in res.comparison.results if r.policy.name == "snapkv")
        note = f" · *{origin(entry)}{'; tokens/s measured then' if entry else ''}*"
        note += f"\n\n{eviction_fig.needle_scope(NEEDLE_POLICIES)}"
        return {
            **{targets.form[k]: value for k, value in settings.items()},
            **targets.show_run(snap.run, snap.policy),
            **comparison.shown(res.comparison, res.found(), note),
        }

    def stored_needle(request: gr.Request, comp, live):
        """The needle demo's outputs when its result is stored (for a show-me), else None."""
        entry = ctx.store.entry(needle_key(comp))
        done = entry is not None and entry.state == "done"
        return needle(ctx, comp, False, request=request) if done else None

    needle = ModelJob(
        "needle demo",
        check=lambda _ctx, comp, live: NeedleAsk(comp, bool(live)),
        run=run_needle,
        size=lambda _req: Size(NEEDLE_TOKENS, 16, runs=3),
        store=True,
        progress=True,
    )
    needle_outputs = [*targets.outputs, *comparison.outputs]
    ctx.answers["eviction.needle"] = ShowMeAnswer([compress, section.live], needle_outputs, stored_needle)
    needle.event(ctx, section.needle.click, [compress, section.live], needle_outputs)

    def sinks_job(report, should_stop):
        return library_call(lambda: sinks_demo(ctx.lm, progress=report), what="Sinks demo")

    ctx.store.plan((ctx.lm.name, "sinks"), "sinks demo", sinks_job)
    ctx.planners["eviction.sinks"] = lambda values: (ctx.lm.name, "sinks")

    def sinks_shown(res, entry) -> dict:
        ppl = " · ".join(f"{name}: **{v:.1f}**" for name, v in res.perplexity.items())
        return {
            section.sinks_text: f"Perplexity after the cache first fills (position > {res.cache_size}): {ppl} "
            f"· *{origin(entry)}*",
            section.sinks_plot: fig.sinks_figure(res),
        }

    def run_sinks(job):
        return sinks_shown(*shared(job, (ctx.lm.name, "sinks"), sinks_job, live=job.req))

    def example(_value, _entry, request: gr.Request | None) -> dict:
        """The stored needle demo in the tab's views, and the sinks demo beside it once it is stored too."""
        shown = dict(needle(ctx, NEEDLE.values["eviction.compress"], False, request=request))
        sinks_entry = ctx.store.entry((ctx.lm.name, "sinks"))
        if sinks_entry is not None and sinks_entry.state == "done":
            shown.update(sinks_shown(sinks_entry.value, sinks_entry))
        return shown

    ctx.examples["tab_eviction"] = (
        Example(
            what=f"the needle demo: SnapKV keeps the code {NEEDLE_ANSWER} at {NEEDLE_BUDGET} tokens, StreamingLLM loses it",
            change="change the context, question, policy or budget and press **Run policy**",
            key=once(lambda: plan_needle(NEEDLE.values)),
            draw=example,
            outputs=[*needle_outputs, section.sinks_text, section.sinks_plot],
            values={compress: NEEDLE.values["eviction.compress"]},
        ),
        line,
    )

    sinks = ModelJob(
        "sinks demo",
        check=lambda _ctx, live: bool(live),
        run=run_sinks,
        size=lambda _req: Size(SINKS_CACHE, SINKS_TOKENS - SINKS_CACHE, runs=3, window=SINKS_CACHE),
        store=True,
        progress=True,
    )
    sinks.event(ctx, section.sinks.click, [section.live], [section.sinks_text, section.sinks_plot])
