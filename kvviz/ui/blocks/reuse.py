"""Blocks tab sections on reuse: what a page size costs on the room's own requests, and what a shared cache
leaks to a second session (measured on the model, in a store of its own).

The page-size replay needs only the tokenizer (:func:`kvviz.blocks.page_size.replay`), so it is drawn
when the tab is built; the side channel runs the model through :class:`ModelJob`
(:func:`kvviz.engine.side_channel.measure`). Figures from :mod:`kvviz.figures.prefix_tiers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from kvviz.blocks.page_size import replay
from kvviz.capture.model_io import encode_prompt
from kvviz.demo_store import Compute
from kvviz.engine.side_channel import Leak, measure
from kvviz.examples import chapter_text
from kvviz.examples.room import room_requests
from kvviz.figures import prefix_tiers as fig
from kvviz.lessons.objectives import SIDE_CHANNEL
from kvviz.safety import whole_number
from kvviz.ui.page.widgets import captioned_plot
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.precompute import live_box, origin, shared
from kvviz.ui.serving.sessions import user_errors

LEAK_TOKENS = 192  # long enough that a prefill takes far longer than a hit, short enough for a quick show-me
MAX_TRIES = 6
PAGES = (
    "### Page size costs reuse\nThe room's requests (the example every student presses, then three waves of "
    "24 students' own questions, through the chat template) replayed through a prefix cache at four block "
    "sizes. A block is reused only when it is full and matches to its end, so the tokens a request shares "
    "past its last full shared block are computed again."
)
LEAK = (
    "### What a shared cache leaks\nA prefix store shared by every session answers a prompt someone already "
    "sent without computing it, so its first token comes much sooner — and a second session that times its "
    "answer learns whether another sent that prompt (a document, a system prompt, a question). vLLM's "
    "`cache_salt` closes the channel; here a per-session salt in the block hash (`KVVIZ_CACHE_SALT`, on in "
    "public mode, off for a lecture room, where sharing the system prompt is the point) does. The measurement "
    "runs in a store of its own: the room's cache is not touched."
)


def leak_summary(leak: Leak) -> str:
    """The medians and how often the second session's guess is right, per store."""
    lines = []
    for salted in (False, True):
        sent, new = leak.median(salted, True) * 1000, leak.median(salted, False) * 1000
        store = "**Salted per session**" if salted else "**Shared store**"
        lines.append(
            f"{store}: median time to first token {sent:,.0f} ms when another session sent the prompt, "
            f"{new:,.0f} ms when no one did — the second session guesses right in "
            f"**{leak.guessed_right(salted):.0%}** of its requests (50 %: a coin)."
        )
    return "\n\n".join(lines)


@dataclass(frozen=True)
class LeakAsk:
    """A checked side-channel timing: the tries per case, the prompt's ids, its store key and computation,
    and *Recompute live*."""

    tries: int
    ids: tuple
    key: tuple
    compute: Compute
    fresh: bool


def build(ctx: AppContext) -> tuple[Callable[[], dict], list]:
    """Both sections, inside the Blocks tab; returns how to show the stored timing and its outputs (the tab's
    first open draws it)."""
    gr.Markdown(PAGES)
    frame = replay([encode_prompt(ctx.lm, p, True) for p in room_requests()])
    captioned_plot("Reuse per block size", "pages-chart", fig.CAPTIONS["pages"], fig.page_size_chart(frame))
    gr.Dataframe(fig.page_size_table(frame), label="Per block size", interactive=False, elem_id="pages-table")

    gr.Markdown(LEAK)
    with gr.Row():
        tries = gr.Slider(2, MAX_TRIES, value=3, step=1, label="Tries per case", elem_id="leak-tries")
        button = gr.Button("Time a second session", variant="primary", elem_id="leak-run")
        live = live_box("leak-live")
    summary = gr.Markdown(elem_id="leak-summary")
    chart = captioned_plot("A second session's time to first token", "leak-chart", fig.CAPTIONS["leak"])
    ctx.components.update({"blocks.leak_tries": tries, "blocks.leak_run": button})
    ctx.components.update({"blocks.leak_summary": summary, "blocks.leak_chart": chart})

    def job(n, fresh: bool = False) -> LeakAsk:
        """One timing: the number of tries checked first, then its store key, prompt and computation."""
        with user_errors():
            k = whole_number(n, "Tries", 1, MAX_TRIES)
        ids = encode_prompt(ctx.lm, chapter_text(), False)[: LEAK_TOKENS + 2 * k]

        def compute(report, should_stop) -> Leak:
            return measure(ctx.lm, ids, k, progress=report)

        return LeakAsk(k, tuple(ids), (ctx.lm.name, "side-channel", tuple(ids), k), compute, bool(fresh))

    def plan(values: dict) -> tuple:
        a = job(values.get("blocks.leak_tries", tries.value))
        ctx.store.plan(a.key, "side-channel timing", a.compute)
        return a.key

    # the show-me's timing is measured once and stored like the others, so a restarted server answers it at once
    ctx.planners["blocks.leak_run"] = plan

    def shown(leak, entry) -> dict:
        when = "measured now on this machine" if entry is None else f"measured on this machine, {origin(entry)}"
        return {summary: f"{leak_summary(leak)} · *{when.replace('computed ', '')}*", chart: fig.leak_chart(leak)}

    def run(running) -> dict:
        a: LeakAsk = running.req
        return shown(*shared(running, a.key, a.compute, live=a.fresh))

    side_channel = ModelJob(
        "side-channel timing",
        check=lambda _ctx, n, fresh: job(n, fresh),
        run=run,
        size=lambda a: Size(len(a.ids), 1, runs=6 * a.tries + 2),
        store=True,
        progress=True,
    )
    side_channel.button(ctx, button, [tries, live], [summary, chart])

    def stored() -> dict:
        """The show-me's timing as stored, for the tab's first open (empty while it is not stored)."""
        entry = ctx.store.entry(plan(SIDE_CHANNEL.values))
        return shown(entry.value, entry) if entry and entry.state == "done" else {}

    return stored, [summary, chart]
