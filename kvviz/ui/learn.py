"""Learn tab: the chapter's objectives with "show me" actions, live-computed answers, pitfalls, presentation mode.

Built last, so the other tabs' registered components (``ctx.components``) exist: a "show me" sets
them, switches ``ctx.tabs`` to the view and presses its button (by element id, once the tab is
mounted). Components a build lacks are listed under the button instead of failing. Presentation
mode's toggle is built here and wired by ``kvviz/ui/page/present.py`` (large type, high contrast, no
captions, larger charts; ← / → step the visible step slider).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

import gradio as gr
from gradio.context import Context

from kvviz.capture.loop import capture
from kvviz.demo_store import Compute, Progress
from kvviz.lessons.guesses import judge
from kvviz.lessons.objectives import EQUIVALENCE, OBJECTIVES, PITFALLS, decode_step_view
from kvviz.lessons.questions import QUESTIONS, Answer, Question
from kvviz.lessons.showme import ShowMe
from kvviz.ui.page import sections, tab_switch
from kvviz.ui.page.present import STEP_CLASS
from kvviz.ui.page.showme_js import PRESS_JS
from kvviz.ui.serving import precompute
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob, prompt_ids
from kvviz.ui.serving.sessions import user_errors

EXAMPLE_PROMPT = "Once upon a time"

READY_POLL_S = 2.0  # how often an open Learn tab refreshes the "ready examples" line until all are ready


def _prefix(tab: str) -> str:
    return tab.removeprefix("tab_")


def _elem_id(component, key: str) -> str:
    """The component's element id, giving it one if its tab did not (read when the page config is built)."""
    if not getattr(component, "elem_id", None):
        component.elem_id = "kvviz-" + key.replace(".", "-").replace("_", "-")
    return component.elem_id


def by_name(outputs: list, values) -> dict:
    """A handler's answer as ``{component: value}``: a dict is kept (only the components wired as
    ``outputs``), a tuple or list is matched with ``outputs`` in order, a single value goes to the one output."""
    if isinstance(values, dict):
        wired = {id(c) for c in outputs}
        return {c: v for c, v in values.items() if id(c) in wired}
    if len(outputs) == 1 and not isinstance(values, (list, tuple)):
        values = [values]
    return dict(zip(outputs, values))


def resolve(ctx: AppContext, sm: ShowMe) -> tuple[list[tuple[str, object]], list[str], str | None, bool]:
    """What this build has for a show-me: (key, component) targets, missing keys, press elem id, available?"""
    comps = ctx.components
    targets = [(k, comps[k]) for k in sm.values if k in comps]
    missing = [k for k in [*sm.values, *([sm.press] if sm.press else [])] if k not in comps]
    built = {k.split(".", 1)[0] for k in comps}
    available = _prefix(sm.tab) in built
    press = _elem_id(comps[sm.press], sm.press) if sm.press in comps else None
    return targets, missing, press, available


def show_me_button(
    ctx: AppContext, sm: ShowMe, elem_id: str, pending: gr.State
) -> tuple[gr.Markdown, Callable[[], str]] | None:
    """A button that loads ``sm`` into its view; a note lists what this build lacks. Returns the note and how
    to write it where its "Look for" line is read from the stored result (to refresh once that is ready)."""
    targets, missing, press, available = resolve(ctx, sm)
    box = ctx.tab_box
    assert box is not None and ctx.tabs is not None, "Learn is built inside the app's tabs"
    btn = gr.Button(
        f"▶ Show me: {sm.label}", elem_id=elem_id, variant="primary" if available else "secondary", size="lg"
    )
    # the line its view registered, by the button it presses (or, for a view drawn as it opens, by its anchor)
    look = ctx.look_fors.get(sm.press or sm.anchor or "") if available else None
    suffix = ""
    if not available:
        suffix = f" *(The {_prefix(sm.tab).capitalize()} view is not in this build yet.)*"
    elif missing:
        suffix = f" *(Not in this build: {', '.join(missing)}; the rest is loaded.)*"

    def note() -> str:
        """The line read from the stored result, or the show-me's own (not stored yet, or values these limits refuse)."""
        line = None
        if look:
            with contextlib.suppress(gr.Error):
                line = look(sm.values)
        return f"*Look for:* {line or sm.look_for}{suffix}"

    # the show-me's own line; one read from a stored result is written by the tab's page-load event (``build``)
    shown = gr.Markdown(f"*Look for:* {sm.look_for}{suffix}", elem_classes="learn-note", elem_id=f"{elem_id}-note")
    press_tab = _prefix(sm.press.split(".", 1)[0]) if sm.press else None
    via_generate = bool(press and press_tab == "generate" and _prefix(sm.tab) != "generate")
    first_tab = "tab_generate" if via_generate else sm.tab
    # a view drawn from a generation that is already stored loads in this one event, without the Generate detour
    fast = via_generate and available and "generate.button" in ctx.planners and ctx.trace_state is not None
    key = None
    if fast:
        try:
            key = ctx.planners["generate.button"](sm.values)
        except gr.Error:  # values this deployment's limits refuse (fewer new tokens): the pressed button says why
            fast = False
    views = [o for _, _, o in ctx.listeners if ctx.tab_box not in o] if fast else []
    view_outputs = [c for o in views for c in o]
    # a button whose result is at hand (stored, or arithmetic) answers in this event too, instead of being pressed
    answer = ctx.answers.get(sm.press or "") if available and not fast else None
    mode = gr.Textbox(visible=False) if fast or answer is not None else None
    by_target = {id(c): k for k, c in targets}
    answer_inputs = answer.inputs if answer is not None else []

    def stored_views(trace) -> dict:
        """Every trace view of a stored generation (drawn once at start-up, so these calls are quick)."""
        out: dict = {}
        for fn, inputs, outputs in ctx.listeners:
            if any(outputs is o for o in views):
                out.update(by_name(outputs, fn(trace, *[getattr(c, "value", None) for c in inputs[1:]])))
        return out

    def answered(request: gr.Request, current: list) -> dict | None:
        """The pressed button's outputs for the show-me's values (the session's own for the rest), or None."""
        assert answer is not None
        values = [sm.values[by_target[id(c)]] if id(c) in by_target else v for c, v in zip(answer.inputs, current)]
        try:
            out = answer.fn(request, *values)
        except Exception:  # a refusal (the session's other settings) is the button's to show: press it
            return None
        return None if out is None else by_name(answer.outputs, out)

    # the sub-tab (a section of the Blocks tab) its view, its button and its controls are in, opened by the page
    shown_in = [sections.by_elem_id(sm.anchor or ""), ctx.components.get(sm.press or ""), *(c for _, c in targets)]
    opens = sections.opening(shown_in, ctx.tabs) if available else []

    def load(request: gr.Request, *current):
        """The show-me's values into its targets, the tab to open, and what the view can show at once (by
        component: what is not named stays as it is); the page then opens the sub-tab (``opens``)."""
        if not available:
            gr.Warning(f"The {_prefix(sm.tab)} view is not in this build yet.")
            return gr.skip()
        shown = {c: sm.values[k] for k, c in targets}
        if answer is not None:
            out = answered(request, list(current))
            if out is None:
                return {**shown, box: first_tab, pending: None, mode: "press"}
            return {**shown, box: sm.tab, pending: None, mode: "stored", **out}
        if not fast:
            return {**shown, box: first_tab, pending: sm.tab if via_generate else None}
        entry = ctx.store.entry(key)
        if entry is not None and entry.state == "done":
            trace = entry.value[0]
            stored = {ctx.trace_state: trace, **stored_views(trace)}
            return {**shown, box: sm.tab, pending: None, mode: "stored", **stored}
        return {**shown, box: first_tab, pending: sm.tab, mode: "press"}

    if fast:
        extra = [mode, ctx.trace_state, *view_outputs]
    elif answer is not None:
        extra = [mode, *answer.outputs]
    else:
        extra = []
    outputs = [c for _, c in targets] + [box, pending, *extra]
    assert len({id(c) for c in outputs}) == len(outputs), f"{sm.label}: a show-me sets a component twice"
    event = btn.click(load, answer_inputs, outputs, api_name=False, queue=False)
    if available:  # the tab the handler named opens in the page (tab_switch), then the view's button is pressed
        event = tab_switch.open_after(event, ctx.tabs, box)
        controls = [_elem_id(c, k) for k, c in targets if not k.endswith(("prompt", "chat"))]
        js = PRESS_JS.replace("__PRESS__", json.dumps(press)).replace("__CONTROLS__", json.dumps(controls))
        js = js.replace("__SECTIONS__", json.dumps(opens))
        event.then(None, [mode] if mode is not None else None, None, js=js.replace("__ANCHOR__", json.dumps(sm.anchor)))
    return (shown, note) if look else None


def plan_show_mes(ctx: AppContext) -> None:
    """Plan every show-me's result (and the answers that run the model) in the order a lecture reaches them.
    A show-me whose values this deployment's limits refuse is not planned: its click presses the button, whose
    check says why."""
    keys = []
    # the Generate tab's opening example (the first screen) before the lecture's
    for sm in [EQUIVALENCE] + [s for o in OBJECTIVES for s in o.show_me] + [p.show_me for p in PITFALLS]:
        planner = ctx.planners.get(sm.press or "")
        if planner is not None:
            with contextlib.suppress(gr.Error):
                keys.append(planner(sm.values))
    for i, q in enumerate(QUESTIONS, 1):
        if q.needs_model:
            keys.append(_answer_key(ctx, i))
            ctx.store.plan(keys[-1], f"answer {i}", _answer_job(ctx, q))
    ctx.store.put_first(keys)


def _answer_job(ctx: AppContext, q: Question) -> Compute:
    """An answer that runs the model, as a store computation."""

    def compute(report: Progress, should_stop: Callable[[], bool]) -> Answer:
        with user_errors():
            return q.compute(ctx.lm)

    return compute


def _answer_key(ctx: AppContext, i: int) -> tuple:
    return ctx.lm.name, "answer", i


def reveal(q: Question, ctx: AppContext, guess: object = None, answer: Answer | None = None) -> str:
    """The student's guess beside the answer kvviz computes, then the chapter's answer."""
    if answer is None:
        with user_errors():
            answer = q.compute(ctx.lm if q.needs_model else None)
    mine = judge(q.guess, guess, answer.values) + "\n\n" if q.guess is not None else ""
    return f"{mine}**The chapter:** {q.chapter_answer}\n\n**Computed by kvviz now:** {answer.text}"


def walkthrough(trace, step):
    """Token strip and one sentence for a decode step of the session's trace."""
    if trace is None:
        return [], "No generation yet: press **Load the example** (or generate in the Generate tab)."
    step = max(0, min(int(step or 0), len(trace.steps) - 1))
    with user_errors():
        return decode_step_view(trace, step)


def build(ctx: AppContext) -> None:
    """Build the Learn tab inside the caller's ``gr.Tab`` (after every other tab)."""
    pending = gr.State(None)  # a view to open once a generation started by "show me" has finished
    walk_trace = gr.State(None)
    with gr.Row():
        gr.Markdown(
            "## The KV cache, in five objectives\nEach objective has a **Show me** button that loads a ready "
            "example into the view that demonstrates it. Go through them in order; no typing needed."
        )
        present = gr.Button("Presentation mode", elem_id="present-toggle", size="lg", scale=0)
    ready = gr.Markdown(precompute.readiness(ctx), elem_id="learn-ready")  # read again on every page load
    timer = gr.Timer(READY_POLL_S, active=bool(ctx.store.entries()))

    notes: list[tuple[gr.Markdown, Callable[[], str]]] = []  # "Look for" lines read from stored results
    n = len(OBJECTIVES)
    ids = [f"learn-{o.number}" for o in OBJECTIVES] + ["learn-questions", "learn-pitfalls"]
    with gr.Tabs(elem_id="learn-tabs") as inner:
        for i, obj in enumerate(OBJECTIVES):
            with gr.Tab(f"{obj.number} {obj.title}", id=ids[i]):
                gr.Markdown(
                    f"### Objective {obj.number} of {n}\n> {obj.chapter}\n\n{obj.explanation}",
                    elem_classes="learn-objective",
                )
                for j, sm in enumerate(obj.show_me):
                    if live_note := show_me_button(ctx, sm, f"showme-{obj.number}-{j + 1}", pending):
                        notes.append(live_note)
                if obj.number == 2:
                    _walkthrough(ctx, walk_trace, pending)
                nxt = gr.Button(
                    "Next objective ›" if i + 1 < n else "Check your understanding ›",
                    elem_id=f"learn-next-{obj.number}",
                    size="lg",
                )
                nxt.click(None, None, inner, js=tab_switch.open_js(ids[i + 1]), **tab_switch.QUIET)
        with gr.Tab("Questions", id=ids[n]):
            gr.Markdown("Commit to a guess first, then reveal: kvviz puts its computed answer next to yours.")
            for i, q in enumerate(QUESTIONS, 1):
                gr.Markdown(f"**Q{i}.** {q.question}", elem_classes="learn-question")
                guess = _guess_input(q, i)
                btn = gr.Button(
                    f"Reveal answer {i}" + (" (runs the model)" if q.needs_model else ""),
                    elem_id=f"reveal-{i}",
                    size="lg",
                )
                out = gr.Markdown(elem_id=f"answer-{i}")
                _reveal(ctx, q, i, btn, None if guess is None else [guess], out)
            to_pitfalls = gr.Button("Common pitfalls ›", elem_id="learn-next-questions", size="lg")
            to_pitfalls.click(None, None, inner, js=tab_switch.open_js(ids[n + 1]), **tab_switch.QUIET)
        with gr.Tab("Pitfalls", id=ids[n + 1]):
            for i, p in enumerate(PITFALLS, 1):
                gr.Markdown(f"**{i}. {p.title}.** {p.explanation}", elem_classes="learn-pitfall")
                if live_note := show_me_button(ctx, p.show_me, f"pitfall-{i}", pending):
                    notes.append(live_note)

    def tick() -> dict:
        """The readiness line and the "Look for" lines read from stored results, until every example is ready."""
        active = ctx.store.counts()["done"] < len(ctx.store.entries())
        return {
            ready: precompute.readiness(ctx),
            timer: gr.Timer(active=active),
            **{md: write() for md, write in notes},
        }

    # one event writes every line as the page opens and while examples land (a value function per line was a
    # request of its own each: some thirty at every page load, beside the first screen's)
    outputs = [ready, timer, *[md for md, _ in notes]]
    for trigger in (timer.tick, Context.root_block.load):
        trigger(tick, None, outputs, api_name=False, queue=False, show_progress="hidden")
    ctx.components.update({"learn.tabs": inner, "learn.present": present})
    plan_show_mes(ctx)


def _guess_input(q: Question, i: int) -> gr.components.Component | None:
    """Where the student commits to a guess: a number box or a choice."""
    if q.guess is None:
        return None
    if q.guess.is_number:
        return gr.Number(None, label=q.guess.prompt, elem_id=f"guess-{i}")
    return gr.Radio(list(q.guess.choices), value=None, label=q.guess.prompt, elem_id=f"guess-{i}")


def _reveal(ctx: AppContext, q: Question, i: int, btn: gr.Button, inputs: list | None, out: gr.Markdown) -> None:
    """Wire one Reveal button; an answer that runs the model is a model job, read from the shared store."""
    if not q.needs_model:
        btn.click(lambda guess=None: reveal(q, ctx, guess), inputs, out, api_name=False, concurrency_limit=None)
        return

    def show(job):
        answer, _ = precompute.shared(job, _answer_key(ctx, i), _answer_job(ctx, q), live=False)
        return reveal(q, ctx, job.req, answer)

    answer = ModelJob(
        "answer", check=lambda _ctx, guess=None: guess, run=show, size=lambda _g: Size(64, 64), store=True
    )
    answer.event(ctx, btn.click, inputs, out)


def _walkthrough(ctx: AppContext, walk_trace: gr.State, pending: gr.State) -> None:
    """Step through a real generation's decode steps (← / → in presentation mode)."""
    gr.Markdown("#### Decode, step by step\nEach step feeds only the new token; its K and V join the cache.")
    load = gr.Button("Load the example (“Once upon a time”, 12 tokens)", elem_id="learn-load-example")
    step = gr.Slider(
        0, 1, value=0, step=1, label="Decode step (0 = prefill)", elem_id="learn-step", elem_classes=[STEP_CLASS]
    )
    strip = gr.HighlightedText(
        label="Tokens",
        elem_id="learn-strip",
        show_legend=True,
        combine_adjacent=False,
        # named: Gradio's page turns a colour code into its shades through a canvas on every update (each Play step)
        color_map={"in cache": "blue", "computed this step": "orange", "predicted next": "green"},
    )
    text = gr.Markdown(elem_id="learn-step-text")

    def drawn(trace, at: int) -> dict:
        spans, md = walkthrough(trace, at)
        return {strip: spans, text: md}

    def opened(trace) -> dict:
        """A trace loaded into the walk: the slider spans its steps, step 0 drawn."""
        slider = gr.Slider(minimum=0, maximum=max(1, len(trace.steps) - 1), value=0) if trace else gr.skip()
        return {walk_trace: trace, step: slider, **drawn(trace, 0)}

    def run_example(job) -> dict:
        return opened(capture(ctx.lm, EXAMPLE_PROMPT, chat=False, max_new_tokens=12, should_stop=job.cancel))

    example = ModelJob(
        "walkthrough example",
        check=lambda _ctx: len(prompt_ids(ctx, EXAMPLE_PROMPT, False, 12)[1]),
        run=run_example,
        size=lambda n: Size(n, 12),
    )
    example.event(ctx, load.click, None, [walk_trace, step, strip, text])
    step.change(drawn, [walk_trace, step], [strip, text], api_name=False, queue=False)

    def from_generate(trace, target) -> dict:
        return {**opened(trace), ctx.tab_box: target or "", pending: None}

    if ctx.trace_state is not None:
        # first: a show-me that generated switches to its view at once, while the views redraw behind it
        ctx.on_trace(
            from_generate, [ctx.trace_state, pending], [walk_trace, step, strip, text, ctx.tab_box, pending], first=True
        )
