"""Blocks tab section: serving under a KV budget — the stored replays, four ways to spend one budget side by side,
and a live replay at a budget of the visitor's choice.

Reads ``bench/results/kv_budget.json`` once (:mod:`kvviz.engine.budget_store`); moving the budget slider
redraws from it (no model work). **Recompute live** replays a small room (one wave) on the model at the typed
budget in every mode, through the gate like every model job (``/serve_sim`` is the same as an endpoint); the
same charts draw it. Figures from :mod:`kvviz.figures.kv_budget`. No arithmetic here.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from kvviz.engine.budget_ledger import MODES
from kvviz.engine.budget_store import budgets, load, replays_at, sweep
from kvviz.engine.budget_trace import room_trace
from kvviz.figures import kv_budget as fig
from kvviz.limits import LIVE_KV_BUDGET_NEW_TOKENS, LIVE_KV_BUDGET_STUDENTS, MAX_KV_BUDGET_BYTES, MIN_KV_BUDGET_BYTES
from kvviz.safety import real_number, whole_number
from kvviz.ui.page.widgets import captioned_plot
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.sessions import user_errors

CASES = ("room", "long")  # the stored traces, in the order the view offers them
LIVE = "live"  # the case name of a live replay
INTRO = (
    "### Serving under a KV budget\nThe room's requests replayed on the real model under a fixed amount of KV "
    "memory, decoding every running sequence in one batch per step. **Contiguous** reserves a sequence's whole "
    "cache when it starts (to the model's context, as a static cache, or to its prompt + new tokens); **paged** "
    "takes 8-token blocks as it grows and, when none is free, preempts the latest sequence and recomputes it "
    "later; **prefix sharing** holds the chat template's blocks once; **KIVI-2** stores older entries in 2 bits. "
    "Measured by `bench/kv_budget.py` (steps and answers are exact; seconds are the machine's)."
)
LIVE_INTRO = (
    f"**Recompute live**: a smaller room (one wave of up to {LIVE_KV_BUDGET_STUDENTS} students after the example, "
    f"{LIVE_KV_BUDGET_NEW_TOKENS} new tokens each) replayed now, in every mode, at the budget you type; the charts "
    "above redraw from it. The slider or the trace choice goes back to the stored replays."
)
_PROMPT_TOKENS = 64  # a room request's prompt, about (the chat template and a short question): its cost estimate


@dataclass(frozen=True)
class LiveAsk:
    """A checked live replay: the budget in bytes, the students of its one wave."""

    budget: int
    students: int


def serve_sim(ctx: AppContext, budget_mib: float = 12.0, students: int = 4) -> LiveAsk:
    """The lecture room served under a KV budget, in every way of spending it, replayed on the model now.

    Args:
        budget_mib: the KV budget in MiB (above 0, at most 65,536).
        students: students in the one wave, each with a question of their own after the shared example (1 to 8).

    Returns:
        Per mode (contiguous-context, contiguous, paged, paged+prefix, paged+kivi2): sequences running per step,
        tokens per second, time to first token, preemptions, KV bytes by kind, and whether every answer equals
        its solo run (agreement for the lossy KIVI-2); the same numbers as ``python -m kvviz serve-sim``.
    """
    with user_errors():
        mib = real_number(budget_mib, "KV budget (MiB)", MIN_KV_BUDGET_BYTES / 2**20, MAX_KV_BUDGET_BYTES / 2**20)
        n = whole_number(students, "Students", 1, LIVE_KV_BUDGET_STUDENTS)
    return LiveAsk(int(mib * 2**20), n)


def _size(a: LiveAsk) -> Size:
    # every request once alone (the solo runs answers are compared with), then once per mode
    return Size(_PROMPT_TOKENS, LIVE_KV_BUDGET_NEW_TOKENS, runs=(a.students + 1) * (len(MODES) + 1))


def live_replay(job) -> dict:
    """Every mode at the asked budget on a room of one wave, as a stored result of one case (``live``)."""
    a: LiveAsk = job.req
    requests = room_trace(a.students, waves=1, max_new_tokens=LIVE_KV_BUDGET_NEW_TOKENS)
    done = [0]

    def step(line: str) -> None:
        done[0] += 1
        job.progress(done[0] / len(MODES), line)

    return {"cases": {LIVE: sweep(job.ctx.lm, requests, [a.budget], progress=step)}}


def _api_run(job) -> dict:
    return live_replay(job)["cases"][LIVE]


# the ``/serve_sim`` endpoint (and ``api_serve_sim(ctx, …)`` in tests)
api_serve_sim = ModelJob("KV-budget replay", check=serve_sim, run=_api_run, size=_size)


def case_title(result: dict, case: str) -> str:
    """A stored trace named with its own size (the stored file says how many requests, how long their prompts)."""
    n = len(result["cases"][case]["requests"])
    if case == "long":
        tokens = result.get("settings", {}).get("long_tokens")
        each = f", {tokens:,} tokens each" if tokens else ""
        return f"long prompts ({n} chapter windows{each})"
    return f"the room ({n} short chat questions in waves)"


def _index(stored: list[int], budget: int) -> int:
    return min(range(len(stored)), key=lambda i: abs(stored[i] - budget))


def drawn(result: dict, case: str, index) -> dict[str, object]:
    """Every view at a stored budget (``index`` into the case's budgets, clamped), by view name."""
    stored = budgets(result, case)
    budget = stored[min(max(0, int(index or 0)), len(stored) - 1)]
    runs = replays_at(result, case, budget)
    return {
        "note": fig.note(result, case, budget),
        "running": fig.running_figure(runs),
        "throughput": fig.throughput_figure(result, case, budget),
        "bytes": fig.bytes_figure(runs),
        "table": fig.modes_table(runs),
    }


@dataclass(frozen=True)
class Views:
    """The section's drawn outputs, by name (the keys of :func:`drawn`)."""

    note: gr.Markdown
    running: gr.Plot
    throughput: gr.Plot
    bytes: gr.Plot
    table: gr.Dataframe

    def outputs(self) -> list:
        return [self.note, self.running, self.throughput, self.bytes, self.table]

    def of(self, values: dict[str, object]) -> dict:
        """:func:`drawn`'s values by component."""
        return {getattr(self, name): value for name, value in values.items()}


def _layout(result: dict, cases: list[str], start: int) -> tuple[gr.Radio, gr.Slider, Views]:
    first = budgets(result, cases[0])
    with gr.Row():
        titles = [(case_title(result, c), c) for c in cases]
        case = gr.Radio(titles, value=cases[0], label="Trace", elem_id="kvbudget-case")
        slider = gr.Slider(
            0,
            max(1, len(first) - 1),
            value=start,
            step=1,
            label="KV budget (one stop per stored replay, smallest first)",
            elem_id="kvbudget-budget",
        )
    shown = drawn(result, cases[0], start)
    note = gr.Markdown(shown["note"], elem_id="kvbudget-note")
    with gr.Row():  # two charts a row: each legend and axis stays readable on a projector
        running = captioned_plot("Sequences running", "kvbudget-running", fig.CAPTIONS["running"], shown["running"])
        tput = captioned_plot(
            "Tokens/s against the budget", "kvbudget-throughput", fig.CAPTIONS["throughput"], shown["throughput"]
        )
    byte_split = captioned_plot("Where the bytes went", "kvbudget-bytes", fig.CAPTIONS["bytes"], shown["bytes"])
    table = gr.Dataframe(shown["table"], label="Per mode", interactive=False, elem_id="kvbudget-table", wrap=True)
    gr.Markdown(fig.CAPTIONS["table"], elem_classes="caption")
    gr.Markdown("#### Decode time and the KV a step reads (every stored replay, measured)")
    captioned_plot("Decode step time", "kvbudget-decode", fig.CAPTIONS["decode"], fig.decode_time_figure(result))
    return case, slider, Views(note, running, tput, byte_split, table)


def _live_drawn(job) -> dict[str, object]:
    """A live replay drawn like a stored one, its note saying what it is."""
    a: LiveAsk = job.req
    shown = drawn(live_replay(job), LIVE, 0)
    room = f"{a.students} student{'s' if a.students > 1 else ''} after the example, {LIVE_KV_BUDGET_NEW_TOKENS} tokens"
    return {**shown, "note": f"*Replayed live now ({room} each; the charts show this one budget):* {shown['note']}"}


def build(ctx: AppContext) -> None:
    """The section, inside the Blocks tab."""
    gr.Markdown(INTRO)
    try:
        result = load()
    except (OSError, ValueError, KeyError) as exc:
        gr.Markdown(f"No stored replays to show ({exc}); `bench/kv_budget.py` writes them.")
        return
    cases = [c for c in CASES if c in result["cases"]]
    start = _index(budgets(result, cases[0]), 720 * 2**20)
    case, slider, v = _layout(result, cases, start)
    gr.Markdown(f"The chapter: {fig.CHAPTER}", elem_id="kvbudget-chapter")
    gr.Markdown(LIVE_INTRO)
    with gr.Row():
        mib = gr.Number(12, label="KV budget (MiB)", elem_id="kvbudget-live-mib")
        students = gr.Slider(1, LIVE_KV_BUDGET_STUDENTS, value=4, step=1, label="Students", elem_id="kvbudget-live-n")
        live = gr.Button("Recompute live", variant="primary", elem_id="kvbudget-live")
    ctx.components.update({"blocks.kv_budget": slider, "blocks.kv_budget_live": live})
    opening = budgets(result, cases[0])[start]
    ctx.look_fors["kvbudget-note"] = lambda _values: fig.note(result, cases[0], opening)  # Learn's objective 4

    def new_case(c) -> dict:
        stored = budgets(result, c)
        i = _index(stored, 720 * 2**20)
        return {slider: gr.Slider(minimum=0, maximum=max(1, len(stored) - 1), value=i), **v.of(drawn(result, c, i))}

    def moved(c, i) -> dict:
        return v.of(drawn(result, c, i))

    # the visitor's own move (``input``): a new trace sets the slider and draws in the same answer
    slider.input(moved, [case, slider], v.outputs(), show_progress="hidden", api_name=False, trigger_mode="always_last")
    case.change(new_case, [case], [slider, *v.outputs()], show_progress="hidden", api_name=False)

    def run_live(job) -> dict:
        return v.of(_live_drawn(job))

    job = ModelJob("KV-budget replay", check=serve_sim, run=run_live, size=_size, progress=True)
    job.button(ctx, live, [mib, students], v.outputs())
    api_serve_sim.api(ctx, api_name="serve_sim")
