"""A tab's first open draws its ready example: the show-me result the store holds (computed at start-up or read back
from disk), every chart drawn, and one line saying what the example is and what to change to try your own.

Each tab declares its :class:`Example` (which store key, which controls it sets, how a stored value becomes
``{component: value}``) and :func:`install` wires the tab's ``select`` event: the first open of a session draws the
example; an example still being computed says so with its progress and is drawn when it lands; a tab whose controls
a link (or the user) already changed keeps them and only says how to draw them. Reading the store is a dictionary
look-up; the figures of a stored trace were drawn once at start-up (``precompute.memo_listener``), so a first open
sends what is already there and computes nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from kvviz.demo_store import Entry
from kvviz.ui.serving import precompute
from kvviz.ui.serving.context import AppContext

POLL_S = 1.0  # how often a tab waiting for its example asks for the computation's progress


@dataclass
class Example:
    """A tab's ready example in the show-me store.

    ``what`` names it ("a ~300-token chapter passage, N = 32"); ``change`` says how to try your own ("change the
    prompt and press **Run**"); ``key`` returns its planned store key (None: none planned in this build);
    ``values`` are the controls it sets (component → value), set only while every one still holds its opening
    value; ``draw(value, entry, request)`` turns the stored value into ``{component: value}`` for ``outputs``."""

    what: str
    change: str
    key: Callable[[], Hashable | None]
    draw: Callable[[Any, Entry, gr.Request | None], dict]
    outputs: list
    values: dict = field(default_factory=dict)


def note(example: Example, entry: Entry | None) -> str:
    """The line above a drawn example: what it is, where it came from, and what to change."""
    where = f", {precompute.origin(entry)}" if entry is not None else ""
    return f"**Example:** {example.what}{where}. **Try your own:** {example.change}."


def waiting(example: Example, entry: Entry) -> str:
    """The line while the example is still being computed (its progress), or queued behind others."""
    if entry.state == "running":
        done = f"{100 * entry.fraction:.0f} %" + (f", {entry.desc}" if entry.desc else "")
        return f"**Example being prepared:** {example.what} ({done}); it appears here when ready. Or {example.change}."
    return f"**Example queued:** {example.what} is computed after the examples before it. Or {example.change}."


def untouched(example: Example, current: list, shared: Callable[[Any], bool] = lambda _: False) -> bool:
    """Every control the example sets still holds its opening value (no link or user changed it). A value the
    show-me store ``shared`` counts too: the page opens on the stored chat example's trace, which is not a run
    of the user's own, so a tab that follows the session's trace still shows its own example."""
    return all(_same(v, c.value) or (v is not None and shared(v)) for c, v in zip(example.values, current))


def _same(a, b) -> bool:
    try:
        return a == b or float(a) == float(b)
    except (TypeError, ValueError):
        return False


def first_open(ctx: AppContext, example: Example, opened: gr.State, line: gr.Markdown, timer: gr.Timer):
    """The handler of the tab's ``select`` event and of its timer: draws the example once it is stored; until then
    says how far its computation is and keeps the timer polling."""
    controls = list(example.values)

    def handler(request: gr.Request, was_opened, *current) -> dict:
        if was_opened:
            return {timer: gr.Timer(active=False)}
        key = example.key()
        entry = ctx.store.entry(key) if key is not None else None
        if entry is None or not untouched(example, list(current), ctx.store.is_shared):
            return {opened: True, timer: gr.Timer(active=False), line: f"**Try your own:** {example.change}."}
        if entry.state != "done":
            if entry.state == "pending" and not ctx.settings.precompute:
                change = example.change[0].upper() + example.change[1:]
                return {opened: True, timer: gr.Timer(active=False), line: f"**No ready example yet.** {change}."}
            return {timer: gr.Timer(active=True), line: waiting(example, entry)}
        drawn = example.draw(entry.value, entry, request)
        return {opened: True, timer: gr.Timer(active=False), line: note(example, entry), **example.values, **drawn}

    return handler, [opened, *controls], [opened, timer, line, *controls, *example.outputs]


def install(ctx: AppContext, tab: gr.Tab, example: Example, line: gr.Markdown) -> None:
    """Draw ``example`` the first time this session opens ``tab`` (``line`` carries its one-line note); while the
    example is still being computed, a timer asks again every :data:`POLL_S` seconds."""
    opened = gr.State(False)
    timer = gr.Timer(POLL_S, active=False)
    fn, inputs, outputs = first_open(ctx, example, opened, line, timer)
    unique = list({id(c): c for c in outputs}.values())
    for trigger in (tab.select, timer.tick):
        trigger(fn, inputs, unique, api_name=False, queue=False, show_progress="hidden")


def once(fn: Callable[[], Hashable | None]) -> Callable[[], Hashable | None]:
    """``fn`` called on first use only (a store key is worked out once, not on every first open)."""
    kept: list = []

    def key() -> Hashable | None:
        if not kept:
            kept.append(fn())
        return kept[0]

    return key


def trace_views(ctx: AppContext, trace, outputs: list) -> dict:
    """``{component: value}`` of the registered trace listener whose outputs are ``outputs``, for ``trace`` (a
    stored trace's views were drawn once at start-up, so this reads them back)."""
    for fn, inputs, outs in ctx.listeners:
        if outs is outputs:
            values = fn(trace, *[getattr(c, "value", None) for c in inputs[1:]])
            if not isinstance(values, dict) or not all(isinstance(c, gr.components.Component) for c in values):
                values = dict(zip(outs, values if len(outs) > 1 else (values,)))
            return {c: v for c, v in values.items() if not _skipped(v)}
    raise LookupError("no trace listener draws these outputs")


def _skipped(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1
