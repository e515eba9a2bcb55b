"""Blocks tab section: serving under a KV budget — the stored replays, four ways to spend one budget side by side.

Reads ``bench/results/kv_budget.json`` once (:mod:`kvviz.engine.budget_store`); moving the budget slider
redraws from it (no model work); figures from :mod:`kvviz.figures.kv_budget`. No arithmetic here.
"""

from __future__ import annotations

import gradio as gr

from kvviz.engine.budget_store import budgets, load
from kvviz.figures import kv_budget as fig
from kvviz.ui.page.widgets import captioned_plot
from kvviz.ui.serving.context import AppContext

CASES = {"room": "the room (73 short chat questions in waves)", "long": "long prompts (2,000 tokens each)"}
INTRO = (
    "### Serving under a KV budget\nThe room's requests replayed on the real model under a fixed amount of KV "
    "memory, decoding every running sequence in one batch per step. **Contiguous** reserves a sequence's whole "
    "cache when it starts (to the model's context, as a static cache, or to its prompt + new tokens); **paged** "
    "takes 8-token blocks as it grows and, when none is free, preempts the latest sequence and recomputes it "
    "later; **prefix sharing** holds the chat template's blocks once; **KIVI-2** stores older entries in 2 bits. "
    "Measured by `bench/kv_budget.py` (steps and answers are exact; seconds are the machine's)."
)


def _index(stored: list[int], budget: int) -> int:
    return min(range(len(stored)), key=lambda i: abs(stored[i] - budget))


def views(result: dict, case: str, index) -> tuple:
    """(budget line, sequences running, tokens/s against budget, bytes by kind, table) at a stored budget."""
    from kvviz.engine.budget_store import replays_at

    stored = budgets(result, case)
    i = min(max(0, int(index or 0)), len(stored) - 1)
    budget = stored[i]
    runs = replays_at(result, case, budget)
    return (
        fig.note(result, case, budget),
        fig.running_figure(runs),
        fig.throughput_figure(result, case, budget),
        fig.bytes_figure(runs),
        fig.modes_table(runs),
    )


def build(ctx: AppContext) -> None:
    """The section, inside the Blocks tab."""
    gr.Markdown(INTRO)
    try:
        result = load()
    except (OSError, ValueError, KeyError) as exc:
        gr.Markdown(f"No stored replays to show ({exc}); `bench/kv_budget.py` writes them.")
        return
    cases = [c for c in CASES if c in result["cases"]]
    first = budgets(result, cases[0])
    start = _index(first, 720 * 2**20)
    with gr.Row():
        case = gr.Radio([(CASES[c], c) for c in cases], value=cases[0], label="Trace", elem_id="kvbudget-case")
        slider = gr.Slider(
            0,
            max(1, len(first) - 1),
            value=start,
            step=1,
            label="KV budget (one stop per stored replay, smallest first)",
            elem_id="kvbudget-budget",
        )
    line, running, throughput, byte_split, rows = views(result, cases[0], start)
    note = gr.Markdown(line, elem_id="kvbudget-note")
    with gr.Row():
        p_running = captioned_plot("Sequences running", "kvbudget-running", fig.CAPTIONS["running"], running)
        p_tput = captioned_plot(
            "Tokens/s against the budget", "kvbudget-throughput", fig.CAPTIONS["throughput"], throughput
        )
        p_bytes = captioned_plot("Where the bytes went", "kvbudget-bytes", fig.CAPTIONS["bytes"], byte_split)
    table = gr.Dataframe(rows, label="Per mode", interactive=False, elem_id="kvbudget-table", wrap=True)
    gr.Markdown(fig.CAPTIONS["table"], elem_classes="caption")
    gr.Markdown(f"The chapter: {fig.CHAPTER}", elem_id="kvbudget-chapter")
    outputs = [note, p_running, p_tput, p_bytes, table]
    ctx.components["blocks.kv_budget"] = slider  # a link or show-me may set the budget

    def redraw(c, i):
        return views(result, c, i)

    def new_case(c):
        stored = budgets(result, c)
        i = _index(stored, 720 * 2**20)
        return (gr.Slider(minimum=0, maximum=max(1, len(stored) - 1), value=i), *views(result, c, i))

    slider.change(redraw, [case, slider], outputs, show_progress="hidden", api_name=False)
    case.change(new_case, [case], [slider, *outputs], show_progress="hidden", api_name=False)
