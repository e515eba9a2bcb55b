"""The Generate tab's multi-turn chat: each Generate is the next turn of one conversation, and a view of
what each turn reused from the previous turn's cache (:mod:`kvviz.figures.chat`).

A turn's prompt is the whole conversation rendered through the chosen template
(:mod:`kvviz.chat.history`); the run keeps its prompt and answer in the engine's prefix store
(``keep_turn``), so the next turn starts from them as far as the template repeats them. The
conversation lives in the session's ``gr.State``: each turn's user text, answer, token ids (prompt and
answer as generated) and how many of them the store kept, and its report.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import plotly.graph_objects as go

from kvviz.chat.history import MODEL, TEMPLATES, available, messages, parse_history, previous_turn, render
from kvviz.chat.turns import TurnReport, turn_report
from kvviz.engine.chat_turn import held_tokens
from kvviz.figures import chat as fig
from kvviz.limits import check_prompt_length, prompt_limit
from kvviz.ui.generate import chat_demo
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.sessions import user_errors


def chat_ids(ctx: AppContext, user: str, history, template: str, n_new: int) -> tuple[list[dict], list[int]]:
    """The checked history and the turn's prompt ids (the conversation through ``template``), within the
    deployment's prompt limit with ``n_new`` more tokens."""
    with user_errors():
        if template not in available(ctx.lm.tokenizer):
            raise ValueError(
                f"Chat template {str(template)[:40]!r} is not one of {', '.join(available(ctx.lm.tokenizer)) or 'none'} "
                "(multi-turn chat needs a model with a chat template)."
            )
        turns = parse_history(history, ctx.settings.max_prompt_chars)
        ids = render(ctx.lm.tokenizer, messages(turns, user), template)
        limit = prompt_limit(ctx.settings.max_prompt_tokens, ctx.info.context_length)
        check_prompt_length(len(ids), n_new, limit, "The conversation")
    return turns, ids


def history_of(conversation) -> list[dict]:
    """The session's conversation as the messages a template renders."""
    out: list[dict] = []
    for turn in conversation or []:
        out += [{"role": "user", "content": turn["user"]}, {"role": "assistant", "content": turn["answer"]}]
    return out


def api_turn(ctx: AppContext, trace, history: list[dict], template: str, owner: str | None = None) -> dict:
    """``/chat``'s account of a chat turn: the tokens reused and computed and the first position where the
    prompt differs from the previous turn's tokens (rebuilt from the history: the client sends text)."""
    tok = ctx.lm.tokenizer
    previous = previous_turn(tok, history, template)
    store = ctx.engine.prefix
    cached = held_tokens(store, previous, owner) if store is not None and previous else 0
    report = turn_report(tok, trace, previous, cached, len(history) // 2 + 1)
    return {**report.as_dict(), "verdict": report.verdict()}


def build(ctx: AppContext) -> dict:
    """The chat section's controls and views (inside the tab's layout); returns them by name."""
    names = available(ctx.lm.tokenizer)
    demo = chat_demo.layout()  # outside the section, so a show-me can press it while the section is closed
    with gr.Accordion(
        "Multi-turn chat: does the next turn reuse this one's cache?", open=False, elem_id="chat"
    ) as section:
        with gr.Row():
            multi = gr.Checkbox(False, label="Multi-turn: each Generate is the next turn", elem_id="chat-multi")
            template = gr.Dropdown(
                [(TEMPLATES[n], n) for n in names] or [(TEMPLATES[MODEL], MODEL)],
                value=MODEL,
                label="Chat template",
                elem_id="chat-template",
            )
            new = gr.Button("New conversation", elem_id="chat-new", size="sm")
        log = gr.Chatbot(label="Conversation", elem_id="chat-log", height=260)
        with gr.Row():
            with gr.Column(scale=3):
                turns = gr.Plot(label="Reuse per turn", elem_id="chat-turns")
            with gr.Column(scale=2):
                gr.Markdown(fig.CAPTIONS["turns"])
        with gr.Row():
            with gr.Column(scale=3):
                diff = gr.Markdown(elem_id="chat-diff")
            with gr.Column(scale=2):
                gr.Markdown(fig.CAPTIONS["diff"])
    state = gr.State([])
    views = {"state": state, "log": log, "turns": turns, "diff": diff}  # by the names of Turn's fields
    new.click(
        lambda: dict(zip(views.values(), ([], [], None, ""))), None, list(views.values()), queue=False, api_name=False
    )
    chat_demo.wire(ctx, *demo, [section, log, turns, diff])
    return {"multi": multi, "template": template, "state": state, "views": views}


@dataclass(frozen=True)
class Turn:
    """What the chat section shows after a turn, by name (its components carry the same names)."""

    state: list  # the conversation: every turn's text, ids and report
    log: list  # the messages, as the chatbot shows them
    turns: go.Figure
    diff: str


def after_turn(ctx: AppContext, trace, conversation, multi: bool) -> Turn | None:
    """Add the finished run to the conversation (a chat turn the conversation does not have yet) and redraw
    (None: not a new turn, nothing changes)."""
    conversation = list(conversation or [])
    if not multi or trace is None or trace.turn_cached_tokens is None:
        return None
    ids = list(trace.token_ids)
    if conversation and conversation[-1]["ids"] == ids:  # the same run again (a failed turn keeps the last)
        return None
    last = conversation[-1] if conversation else None
    report = turn_report(
        ctx.lm.tokenizer,
        trace,
        last["ids"] if last else [],
        last["cached"] if last else 0,
        len(conversation) + 1,
    )
    turn = {"user": trace.prompt, "answer": trace.text, "ids": ids, "cached": trace.turn_cached_tokens}
    conversation.append({**turn, "report": report.as_dict()})
    reports = [TurnReport(**t["report"]) for t in conversation]
    return Turn(conversation, history_of(conversation), fig.turns_figure(reports), fig.divergence_text(report))
