"""The Generate tab's chat section, shown without typing: a stored two-turn conversation and what its second turn
reused (the Learn tab's chat-reuse show-me, ``generate.chat_demo``).

:func:`kvviz.engine.chat_demo.chat_demo` runs the turns through an engine of their own; its result is stored like
the other show-mes' (computed at start-up, read back by a restarted server), so the button and the show-me answer
at once; *Recompute live* runs it again. It draws into the section's conversation, chart and verdict and leaves the
session's own conversation as it was (its next multi-turn Generate redraws them).
"""

from __future__ import annotations

import gradio as gr

from kvviz.chat.history import MODEL
from kvviz.engine.chat_demo import NEW_TOKENS, QUESTIONS, ChatDemo, chat_demo
from kvviz.figures import chat as fig
from kvviz.ui.serving.context import AppContext, ShowMeAnswer
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.precompute import live_box, origin, shared


def layout() -> tuple[gr.Button, gr.Checkbox]:
    """The demo's button and its *Recompute live* box (a row just above the chat section, which it opens)."""
    with gr.Row():
        button = gr.Button(
            f"Show two turns (“{QUESTIONS[0]}”, then “{QUESTIONS[1]}”)", elem_id="chat-demo-run", size="sm"
        )
        live = live_box("chat-demo-live")
    return button, live


def _key(ctx: AppContext) -> tuple:
    return ctx.lm.name, "chat demo", MODEL, QUESTIONS, NEW_TOKENS


def shown(views: list, demo: ChatDemo, when: str) -> dict:
    """The conversation, the reuse chart and the last turn's verdict (``when``: where it was computed), with the
    section opened (``views``: the accordion, the chatbot, the chart, the verdict)."""
    section, log, turns, diff = views
    messages = [
        m for t in demo.turns for m in ({"role": "user", "content": t.user}, {"role": "assistant", "content": t.answer})
    ]
    reports = [t.report for t in demo.turns]
    return {
        section: gr.Accordion(open=True),
        log: messages,
        turns: fig.turns_figure(reports),
        diff: f"{fig.divergence_text(reports[-1])} · *{when}*",
    }


def wire(ctx: AppContext, button: gr.Button, live: gr.Checkbox, views: list) -> None:
    """Plan the demo, answer the show-me from the store, read its "Look for" line from it, and wire the button."""

    def compute(report, should_stop) -> ChatDemo:
        return chat_demo(ctx.lm)

    def plan(values: dict) -> tuple:
        ctx.store.plan(_key(ctx), "two-turn chat", compute)
        return _key(ctx)

    def stored():
        entry = ctx.store.entry(_key(ctx))
        return entry if entry is not None and entry.state == "done" else None

    def answer(_request, fresh) -> dict | None:
        entry = None if fresh else stored()
        return None if entry is None else shown(views, entry.value, origin(entry))

    def look_for(_values: dict) -> str | None:
        entry = stored()
        return None if entry is None else fig.look_for([t.report for t in entry.value.turns])

    def run(job) -> dict:
        demo, entry = shared(job, _key(ctx), compute, live=bool(job.req))
        return shown(views, demo, origin(entry))

    ctx.components["generate.chat_demo"] = button
    ctx.planners["generate.chat_demo"] = plan
    ctx.answers["generate.chat_demo"] = ShowMeAnswer([live], views, answer)
    ctx.look_fors["generate.chat_demo"] = look_for
    job = ModelJob(
        "two-turn chat",
        check=lambda _ctx, fresh: bool(fresh),
        run=run,
        size=lambda _r: Size(64, NEW_TOKENS, runs=len(QUESTIONS)),
        store=True,
        progress=True,
    )
    job.button(ctx, button, [live], views)
