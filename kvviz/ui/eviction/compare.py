"""Eviction tab section: the full cache and several policies side by side, on the tab's prompt and budget.

:func:`kvviz.eviction.compare.compare` runs them (one job through the gate for all); the table and
charts come from :mod:`kvviz.figures.eviction_compare`. The comparison the tab opens with is planned at
start-up, so its first click answers at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from kvviz.eviction.compare import compare
from kvviz.eviction.policies import POLICIES, make_policy
from kvviz.eviction.run import EvictionRequest, resolve_budget
from kvviz.examples import NEEDLE_ANSWER
from kvviz.figures import eviction_compare as fig
from kvviz.ui.eviction.request import library_call, policy_passes
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.jobs import UserError
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.precompute import live_box, origin, shared


@dataclass
class CompareSection:
    """The section's controls and outputs, laid out where the tab places them."""

    chosen: gr.CheckboxGroup
    button: gr.Button
    live: gr.Checkbox
    verdict: gr.Markdown
    table: gr.Dataframe
    bytes_plot: gr.Plot
    kl_plot: gr.Plot

    @property
    def outputs(self) -> list:
        """What :meth:`shown` may write (the wiring's set; handlers answer by name)."""
        return [self.verdict, self.table, self.bytes_plot, self.kl_plot]

    def shown(self, cmp, found: dict | None = None, note: str = "") -> dict:
        """The verdict line (``note`` after it), table and charts for a comparison (``found``: the needle
        demo's policy → whether its answer kept the fact)."""
        text = f"Full cache answered: *{cmp.full.text.strip()}*"
        if found is not None:
            text = " · ".join(
                f"**{POLICIES[n].title}**: {'found' if ok else 'lost'} {NEEDLE_ANSWER}" for n, ok in found.items()
            )
        return {
            self.verdict: text + note,
            self.table: fig.comparison_table(cmp),
            self.bytes_plot: fig.bytes_figure(cmp),
            self.kl_plot: fig.kl_figure(cmp),
        }


@dataclass(frozen=True)
class CompareAsk:
    """A checked comparison: the tab's request, the policies beside the full cache, and *Recompute live*."""

    req: EvictionRequest
    pols: tuple
    live: bool


def layout() -> CompareSection:
    """The heading, the policies to compare, the button, the verdict, the table and two charts."""
    gr.Markdown("### Side by side: full cache vs policies (same prompt, same budget)")
    with gr.Row():
        chosen = gr.CheckboxGroup(
            [(cls.title, n) for n, cls in POLICIES.items() if n != "full"],
            value=["streaming_llm", "h2o", "snapkv"],
            label="Policies to compare (default parameters; the selected policy uses yours)",
            elem_id="evict-compare-policies",
        )
        with gr.Column(scale=0, min_width=260):
            button = gr.Button("Compare", elem_id="evict-compare")
            live = live_box("evict-compare-live")
    verdict = gr.Markdown(elem_id="evict-verdict")
    table = gr.Dataframe(
        waiting_table("Press Compare to see each policy's answer next to the full cache's"),
        label="Answers and agreement with the full cache",
        elem_id="evict-table",
        wrap=True,
    )
    gr.Markdown(fig.CAPTIONS["comparison"], elem_classes="caption")
    with gr.Row():
        bytes_plot = captioned_plot("Cache bytes", "evict-bytes", fig.CAPTIONS["bytes"])
        kl_plot = captioned_plot("KL per step", "evict-kl", fig.CAPTIONS["kl"])
    return CompareSection(chosen, button, live, verdict, table, bytes_plot, kl_plot)


def wire(ctx: AppContext, section: CompareSection, main_inputs: list, gather: Callable[..., EvictionRequest]) -> None:
    """Check, run and plan comparisons of the tab's request (``gather(*main_inputs)``) with the ticked policies."""

    def compare_request(names, *args):
        req = gather(*args)
        if not names:
            raise UserError("Tick at least one policy to compare with the full cache.")
        pols = [req.policy if n == req.policy.name else make_policy(n) for n in names if n in POLICIES]
        for p in pols:
            library_call(resolve_budget, p, req.n_compress, req.budget, req.ratio)
        return dataclasses.replace(req, repeat_passes=policy_passes(ctx, req.ids[: req.n_compress], pols)), pols

    def check(_ctx, live, names, *args) -> CompareAsk:
        req, pols = compare_request(names, *args)
        return CompareAsk(req, tuple(pols), bool(live))

    def compare_key(req, pols) -> tuple:
        return (
            ctx.lm.name,
            "compare",
            tuple(req.ids),
            tuple(repr(p) for p in pols),
            req.budget,
            req.ratio,
            req.n_compress,
            req.max_new_tokens,
        )

    def compare_job(req, pols):
        def compute(report, should_stop):
            return library_call(
                lambda: compare(
                    ctx.lm,
                    req.ids,
                    pols,
                    budget=req.budget,
                    ratio=req.ratio,
                    n_compress=req.n_compress,
                    max_new_tokens=req.max_new_tokens,
                    progress=report,
                    should_stop=should_stop,
                ),
                what="Comparison",
            )

        return compute

    def run_compare(job) -> dict:
        a = job.req
        cmp, entry = shared(job, compare_key(a.req, a.pols), compare_job(a.req, a.pols), live=a.live)
        return section.shown(cmp, note=f" · *{origin(entry)}{'; tokens/s measured then' if entry else ''}*")

    comparison = ModelJob(
        "comparison",
        check=check,
        run=run_compare,
        size=lambda a: Size(
            len(a.req.ids), a.req.max_new_tokens, runs=len(a.pols) + 1, repeat_passes=a.req.repeat_passes
        ),
        store=True,
        progress=True,
    )

    def plan_compare(names, *args) -> None:
        """The comparison the tab opens with (the needle passage, three policies): ready before a click."""
        req, pols = compare_request(names, *args)
        ctx.store.plan(compare_key(req, pols), "eviction comparison", compare_job(req, pols))

    show_mes(ctx, section, main_inputs, compare_request, compare_key, compare_job)
    compared, ran = comparison.button(
        ctx, section.button, [section.live, section.chosen, *main_inputs], section.outputs
    )
    clear_on_refusal(compared, section.outputs)
    clear_on_refusal(ran, section.outputs)
    # a deployment whose limits refuse the tab's opening settings computes the comparison on a click instead
    with contextlib.suppress(UserError, gr.Error):
        plan_compare(section.chosen.value, *[c.value for c in main_inputs])


def show_mes(ctx: AppContext, section: CompareSection, main_inputs: list, request, key, job) -> None:
    """Learn's comparison show-me (KVzip vs SnapKV): plan it on the store from a show-me's values (``request``,
    ``key`` and ``job``: how the section checks, names and computes a comparison), answer it from the store in the
    show-me's own click, and read its "Look for" line from the stored result."""
    names = {id(c): k for k, c in ctx.components.items()}

    def checked(values: dict):
        args = [values.get(names.get(id(c), ""), c.value) for c in main_inputs]
        return request(values.get("eviction.compare_policies", section.chosen.value), *args)

    def plan(values: dict) -> tuple:
        req, pols = checked(values)
        ctx.store.plan(key(req, pols), "eviction comparison", job(req, pols))
        return key(req, pols)

    def stored(req, pols):
        entry = ctx.store.entry(key(req, pols))
        return entry if entry is not None and entry.state == "done" else None

    def answer(_request, live, chosen, *args) -> dict | None:
        """The section's views of the stored comparison (None: not stored, or *Recompute live* ticked)."""
        entry = None if live else stored(*request(chosen, *args))
        return (
            None if entry is None else section.shown(entry.value, note=f" · *{origin(entry)}; tokens/s measured then*")
        )

    def look_for(values: dict) -> str | None:
        entry = stored(*checked(values))
        return None if entry is None else fig.look_for(entry.value)

    ctx.planners["eviction.compare"] = plan
    ctx.answers["eviction.compare"] = ShowMeAnswer(
        [section.live, section.chosen, *main_inputs], section.outputs, answer
    )
    ctx.look_fors["eviction.compare"] = look_for
