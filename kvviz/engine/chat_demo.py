"""Two chat turns through an engine of their own: the second starts from the cache the first left in its prefix store.

The Generate tab's multi-turn chat shows reuse only once a visitor has sent two turns; the Learn tab's show-me
needs it ready. :func:`chat_demo` sends two questions as a visitor would (the model's own template, the whole
conversation rendered again for the second), through a fresh :class:`~kvviz.engine.engine.Engine` whose prefix
store starts empty — the app's engine and its store are not touched — and records each turn's report
(:func:`kvviz.chat.turns.turn_report`), as the tab's chat does after a turn.

    from kvviz.engine.chat_demo import chat_demo
    demo = chat_demo(lm)           # two greedy turns of 16 tokens on the bundled model, seconds on a CPU
    demo.turns[-1].report.reused   # the second turn's prompt tokens read from the first turn's cache
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.chat.history import MODEL, messages, render
from kvviz.chat.turns import TurnReport, turn_report
from kvviz.engine.engine import Engine
from kvviz.models import LoadedModel

QUESTIONS = ("Which city is the capital of France?", "And of Italy?")
NEW_TOKENS = 16  # each answer, greedy


@dataclass(frozen=True)
class DemoTurn:
    """One turn as the tab's chat keeps it: the user's text, the answer, the turn's tokens (prompt and answer, as
    generated), how many of them the store kept for the next turn, and its report."""

    user: str
    answer: str
    ids: tuple[int, ...]
    cached: int
    report: TurnReport


@dataclass(frozen=True)
class ChatDemo:
    """Every turn, in order (plain values: a show-me result stored on disk)."""

    turns: tuple[DemoTurn, ...]


def chat_demo(lm: LoadedModel, questions: tuple[str, ...] = QUESTIONS, max_new_tokens: int = NEW_TOKENS) -> ChatDemo:
    """Send ``questions`` as the turns of one conversation through an engine of their own (module docstring)."""
    engine = Engine(lm)
    history: list[dict[str, str]] = []
    turns: list[DemoTurn] = []
    try:
        for user in questions:
            ids = render(lm.tokenizer, messages(history, user), MODEL)
            trace = engine.submit(user, prompt_ids=ids, max_new_tokens=max_new_tokens, keep_turn=True).result()
            last = turns[-1] if turns else None
            previous, cached = (list(last.ids), last.cached) if last else ([], 0)
            report = turn_report(lm.tokenizer, trace, previous, cached, len(turns) + 1)
            kept = trace.turn_cached_tokens or 0
            turns.append(DemoTurn(user, trace.text, tuple(trace.token_ids), kept, report))
            history += [{"role": "user", "content": user}, {"role": "assistant", "content": trace.text}]
    finally:
        engine.close()
    return ChatDemo(tuple(turns))
