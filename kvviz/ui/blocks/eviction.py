"""Blocks tab section: eviction meets paging — tokens evicted against blocks actually freed, and compaction.

Checks the prompt, budget and policies, admits one job for all the policy runs and calls
:func:`kvviz.blocks.live.evict_and_page`; figures from :mod:`kvviz.figures.blocks`. No arithmetic here.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from kvviz.blocks.live import evict_and_page
from kvviz.capture.model_io import encode_prompt
from kvviz.eviction.policies import POLICIES, make_policy
from kvviz.examples import needle_prompt
from kvviz.figures import blocks_eviction as fig
from kvviz.limits import MAX_BUDGET_TOKENS
from kvviz.safety import whole_number
from kvviz.ui.blocks.checks import block_size_of, check_prompt
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.sessions import user_errors

CHOICES = ["streaming_llm", "h2o", "snapkv"]
DEFAULT_BUDGET = 64


@dataclass(frozen=True)
class PagingAsk:
    """A checked eviction × paging run: the prompt and its length, the budget, the policies, the block size,
    the chat template or not, and the policy whose survivors are drawn."""

    text: str
    n_prompt: int
    kept: int
    policies: tuple
    block_size: int
    chat: bool
    shown: str


def make(name: str, budget: int):
    """A policy with its default parameters; SnapKV's observation window is at most half the budget."""
    if name == "snapkv":
        return make_policy(name, window_size=max(1, min(64, budget // 2)))
    return make_policy(name)


def check_policy(name, budget):
    """The API's optional policy and budget, checked (None when no policy is asked for)."""
    if name in (None, "") and budget in (None, ""):
        return None
    with user_errors():
        if name not in POLICIES or name == "full":
            raise ValueError(f"Pick a policy: {', '.join(n for n in POLICIES if n != 'full')}.")
        b = whole_number(budget, "Budget", 1, MAX_BUDGET_TOKENS)
        return make(name, b)


def build(ctx: AppContext, block_size: gr.Radio) -> None:
    """The section, inside the Blocks tab (``block_size`` is the tab's block-size control)."""

    gr.Markdown(
        "### Eviction meets paging\nStreamingLLM, H2O and SnapKV each compress the prompt's prefill to the "
        "same budget per layer and KV head. A paged engine gets memory back only for a block whose **every** "
        "slot was evicted; moving the survivors together (compaction) frees the rest but copies bytes. "
        "SnapKV's observation window is set to half the budget (at most 64)."
    )
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(needle_prompt(6, 6), label="Prompt", lines=4, elem_id="evblocks-prompt")
            chat = gr.Checkbox(True, label="Use the chat template", elem_id="evblocks-chat")
        with gr.Column(scale=2):
            budget = gr.Number(
                DEFAULT_BUDGET,
                precision=0,
                label="Budget: entries kept per layer and KV head",
                elem_id="evblocks-budget",
            )
            chosen = gr.CheckboxGroup(
                [(POLICIES[n].title, n) for n in CHOICES], value=CHOICES, label="Policies", elem_id="evblocks-policies"
            )
            button = gr.Button("Evict and count blocks", variant="primary", elem_id="evblocks-run")
    note = gr.Markdown(elem_id="evblocks-note")
    bars = captioned_plot("Tokens evicted vs blocks freed", "evblocks-bars", fig.CAPTIONS["freed"])
    table = gr.Dataframe(
        waiting_table("Press Evict and count blocks to see each policy's freed blocks"),
        label="Per policy",
        interactive=False,
        elem_id="evblocks-table",
        wrap=True,
    )
    gr.Markdown(fig.CAPTIONS["evict_table"], elem_classes="caption")
    pick = gr.Dropdown(
        [(POLICIES[n].title, n) for n in CHOICES], value="h2o", label="Survivors of", elem_id="evblocks-pick"
    )
    grid = captioned_plot("Survivors per block", "evblocks-grid", fig.CAPTIONS["survivors"])
    runs_state = gr.State(None)
    ctx.components.update({"blocks.evict_run": button, "blocks.evict_budget": budget})

    def request_of(_ctx, text, use_chat, b, names, size, shown) -> PagingAsk:
        size = block_size_of(size)
        text, n, _ = check_prompt(ctx, text, use_chat, 1)
        with user_errors():
            kept = whole_number(DEFAULT_BUDGET if b is None else b, "Budget", 1, MAX_BUDGET_TOKENS)
            if not names:
                raise ValueError("Tick at least one policy.")
            policies = tuple(make(name, kept) for name in names if name in CHOICES)
        return PagingAsk(text, n, kept, policies, size, bool(use_chat), shown)

    def run(job) -> dict:
        a: PagingAsk = job.req
        ids = encode_prompt(ctx.lm, a.text, a.chat)
        runs = evict_and_page(ctx.lm, ids, list(a.policies), a.kept, a.block_size, should_stop=job.cancel)
        drawn = {note: fig.eviction_note(runs), bars: fig.freed_bars(runs), table: fig.eviction_table(runs)}
        return {runs_state: runs, **drawn, grid: survivors(runs, a.shown)}

    def survivors(runs, name):
        if not runs:
            return None
        return fig.survivor_grid(next((r for r in runs if r.name == name), runs[0]))

    paging = ModelJob(
        "eviction × paging",
        check=request_of,
        run=run,
        size=lambda a: Size(a.n_prompt, 1, runs=len(a.policies)),
    )
    shown = [runs_state, note, bars, table, grid]
    for event in paging.button(ctx, button, [prompt, chat, budget, chosen, block_size, pick], shown):
        clear_on_refusal(event, [note, runs_state, bars, table, grid])
    pick.change(survivors, [runs_state, pick], grid, api_name=False, show_progress="hidden")
