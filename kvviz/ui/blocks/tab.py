"""Blocks tab: the bundled model's live cache in fixed-size blocks, prefix sharing, and eviction × paging.

The live view reads the session's latest Generate run (``ctx.trace_state``, refreshed after every
generation) or runs its own prompt through the gate; its numbers come from :mod:`kvviz.blocks` and
its figures from :mod:`kvviz.figures.blocks`. The sharing and eviction sections live in
``blocks_sharing.py`` and ``blocks_eviction.py``. No arithmetic here: handlers check inputs and wire
events. The named endpoint ``/blocks`` returns the JSON of ``python -m kvviz blocks --json``.
The engine's real prefix cache, live, is the section in ``blocks_room.py``. Each section is a sub-tab
(:data:`SECTIONS`): the tab opens on the live view, drawn at once, and a section's charts are drawn when it is opened.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from kvviz.blocks.live import blocks_report
from kvviz.blocks.table import allocations, from_trace
from kvviz.capture.loop import capture
from kvviz.figures import blocks as fig
from kvviz.lessons.objectives import SINKS
from kvviz.limits import MAX_STEP
from kvviz.safety import whole_number
from kvviz.ui.blocks import budget as blocks_budget
from kvviz.ui.blocks import eviction as blocks_eviction
from kvviz.ui.blocks import reuse as blocks_reuse
from kvviz.ui.blocks import room as blocks_room
from kvviz.ui.blocks import sharing as blocks_sharing
from kvviz.ui.blocks.checks import BLOCK_SIZES, block_size_of, check_prompt
from kvviz.ui.page.first_sight import Example, once, trace_views
from kvviz.ui.page.play import play_button
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.sessions import user_errors

DEFAULT_PROMPT = "In two sentences: why does a serving engine store the KV cache in fixed-size blocks?"
EMPTY = "Press **Run** (or generate on the **Generate** tab) to lay the live cache out in blocks."


@dataclass
class BlockViews:
    """What the live view shows after one step: the summary, the block grid, one layer's slots, paged vs
    contiguous, and the per-layer table (all None before any run)."""

    summary: str
    grid: object = None
    slots: object = None
    alloc: object = None
    table: object = None


def views(trace, block_size, step, layer) -> BlockViews:
    """Summary, block grid, one layer's slots, paged vs contiguous and the per-layer table after ``step``."""
    if trace is None or not trace.steps:
        return BlockViews(EMPTY)
    b = block_size_of(block_size)
    with user_errors():
        s = whole_number(0 if step is None else step, "Step", 0, MAX_STEP)
        lyr = whole_number(0 if layer is None else layer, "Layer", 0, trace.model.layers - 1)
    s = min(s, len(trace.steps) - 1)
    table = from_trace(trace, b, s)
    m = trace.model
    windows = [m.sliding_window if k == "sliding_attention" else None for k in m.layer_kinds]
    allocs = allocations(
        table, trace.n_prompt + int(trace.settings.get("max_new_tokens", 0)), m.context_length, windows
    )
    what = "after the prefill" if s == 0 else f"after decode step {s}"
    return BlockViews(
        fig.table_summary(table, allocs, f"{m.name}, {what}"),
        fig.block_grid(table),
        fig.block_slots(table, trace.tokens, trace.n_prompt, lyr),
        fig.allocation_bars(allocs),
        fig.layer_table(table),
    )


@dataclass(frozen=True)
class BlockAsk:
    """A checked block-view run: the prompt, the chat template or not, its length in tokens, the new tokens,
    and the block size (None: the view's own)."""

    text: str
    chat: bool
    n_prompt: int
    n_new: int
    block_size: int | None


def prompt_request(ctx: AppContext, prompt, chat, max_new, block_size=None) -> BlockAsk:
    """A block-view run's inputs, checked."""
    text, n, n_new = check_prompt(ctx, prompt, chat, max_new)
    return BlockAsk(text, bool(chat), n, n_new, None if block_size is None else block_size_of(block_size))


def capture_prompt(job) -> object:
    """Generate greedily (the cache is what is shown) and return the finished trace."""
    a: BlockAsk = job.req
    return capture(job.ctx.lm, a.text, chat=a.chat, max_new_tokens=a.n_new, should_stop=job.cancel)


block_view = ModelJob(
    "block view",
    check=prompt_request,
    run=capture_prompt,
    size=lambda a: Size(a.n_prompt, a.n_new),
    failed="Block view run",
)


def run_prompt(ctx: AppContext, prompt, chat, max_new, request: gr.Request | None = None):
    """Generate through the gate and return the finished trace (greedy; the cache is what is shown)."""
    return block_view(ctx, prompt, chat, max_new, request=request)


def status(trace, source: str) -> str:
    if trace is None:
        return EMPTY
    return (
        f"Showing the cache of **{source}**: {trace.n_prompt} prompt + {trace.n_generated} generated tokens "
        f"({len(trace.steps)} steps; step 0 is the prefill)."
    )


@dataclass
class _Views:
    """Every component of the live view, by name."""

    prompt: gr.Textbox
    chat: gr.Checkbox
    block_size: gr.Radio
    max_new: gr.Slider
    run_btn: gr.Button
    state: gr.State
    example: gr.Markdown
    source: gr.Markdown
    step: gr.Slider
    layer: gr.Slider
    summary: gr.Markdown
    grid: gr.Plot
    slots: gr.Plot
    alloc: gr.Plot
    table: gr.Dataframe

    def views(self, b: BlockViews) -> dict:
        shown = {self.summary: b.summary, self.grid: b.grid, self.slots: b.slots, self.alloc: b.alloc}
        return {**shown, self.table: b.table}

    def view_outputs(self) -> list:
        return [self.summary, self.grid, self.slots, self.alloc, self.table]

    def shown(self, trace, src: str, b) -> dict:
        """A finished trace in the live view, the step slider at its last step."""
        last = len(trace.steps) - 1
        fitted = {self.state: trace, self.source: status(trace, src)}
        return {
            **fitted,
            self.step: gr.Slider(minimum=0, maximum=max(1, last), value=last),
            **self.views(views(trace, b, last, 0)),
        }

    def live_outputs(self) -> list:
        return [self.state, self.source, self.step, *self.view_outputs()]


# the tab's sections, one sub-tab each: a sub-tab's charts are drawn when it is first opened, so the tab opens on
# the live view alone instead of drawing some twenty charts at once
SECTIONS = ("Paging, live", "Prefix sharing", "The room's cache", "Eviction × paging", "Under a KV budget")


def build(ctx: AppContext) -> None:
    """Build the tab inside the caller's ``gr.Tab``: the live view's layout and wiring, then the sections, each in
    a sub-tab of its own."""
    paging, sharing, room, evicting, budget = SECTIONS
    with gr.Tabs(elem_id="blocks-sections"):
        with gr.Tab(paging):
            v = _layout(ctx)
            live_outputs = _wire(ctx, v)
        with gr.Tab(sharing):
            blocks_sharing.build(ctx, v.block_size)
        with gr.Tab(room):
            blocks_room.build(ctx)
            leak, leak_outputs = blocks_reuse.build(ctx)
        with gr.Tab(evicting):
            blocks_eviction.build(ctx, v.block_size)
        with gr.Tab(budget):
            blocks_budget.build(ctx)
    planner = ctx.planners.get("generate.button")
    if ctx.trace_state is not None and planner is not None:

        def example(value, entry, request) -> dict:
            trace = value[0]
            return {**trace_views(ctx, trace, live_outputs), v.source: status(trace, "the example run"), **leak()}

        ctx.examples["tab_blocks"] = (
            Example(
                what="the needle passage's cache (16 tokens generated) in blocks, and the side-channel timing below",
                change="type a prompt and press **Run**, or generate on the **Generate** tab",
                key=once(lambda: planner(SINKS.values)),
                draw=example,
                outputs=[*live_outputs, *leak_outputs],
                values={v.state: None},
            ),
            v.example,
        )
    api_blocks.api(ctx, api_name="blocks")


def _layout(ctx: AppContext) -> _Views:
    info = ctx.info
    gr.Markdown(
        f"A paged engine (vLLM, SGLang) stores the KV cache in **fixed-size blocks** and gives a sequence a new "
        f"block only when its last one is full. Below is **{info.name}**'s real cache for one run laid out that way: "
        f'{info.layers} layers × {info.kv_heads} KV heads, {info.dtype}. The chapter: engines "carve [GPU memory] '
        'into blocks" and "prefix caching … avoid[s] recomputing the same prefill".'
    )
    c: dict = {}
    with gr.Row():
        with gr.Column(scale=3):
            c["prompt"] = gr.Textbox(
                DEFAULT_PROMPT, label="Prompt (or generate on the Generate tab)", lines=2, elem_id="blocks-prompt"
            )
            c["chat"] = gr.Checkbox(True, label="Use the chat template", elem_id="blocks-chat")
        with gr.Column(scale=2):
            size_label = "Block size (tokens per block)"
            c["block_size"] = gr.Radio(BLOCK_SIZES, value=16, label=size_label, elem_id="blocks-size")
            top = min(64, ctx.settings.max_new_tokens)
            c["max_new"] = gr.Slider(1, top, value=24, step=1, label="Tokens to generate", elem_id="blocks-max-new")
            c["run_btn"] = gr.Button("Run", variant="primary", elem_id="blocks-run")
    c["state"] = gr.State(None)
    c["example"] = gr.Markdown(elem_id="blocks-example")
    c["source"] = gr.Markdown(EMPTY, elem_id="blocks-status")
    with gr.Row():
        step_label = "Step (0 = after the prefill, then one per generated token)"
        c["step"] = gr.Slider(0, 1, value=0, step=1, label=step_label, elem_id="blocks-step")
        play_button(c["step"], "blocks-play")
        layer_label = "Layer (slot view)"
        c["layer"] = gr.Slider(0, info.layers - 1, value=0, step=1, label=layer_label, elem_id="blocks-layer")
    c["summary"] = gr.Markdown(elem_id="blocks-summary")
    c["grid"] = captioned_plot("Blocks per layer and KV head", "blocks-grid", fig.CAPTIONS["grid"])
    c["slots"] = captioned_plot("One layer, slot by slot", "blocks-slots", fig.CAPTIONS["slots"])
    c["alloc"] = captioned_plot("Paged vs contiguous", "blocks-alloc", fig.CAPTIONS["alloc"])
    c["table"] = gr.Dataframe(
        waiting_table("Press Run to see the blocks of every layer"),
        label="Per layer",
        interactive=False,
        elem_id="blocks-table",
        max_height=300,
    )
    gr.Markdown(fig.CAPTIONS["layers"], elem_classes="caption")
    return _Views(**c)


def _wire(ctx: AppContext, v: _Views) -> list:
    """Register the inputs, wire Run, the pickers and each new Generate run; returns the live view's outputs."""
    ctx.components.update(
        {"blocks.prompt": v.prompt, "blocks.block_size": v.block_size, "blocks.run": v.run_btn, "blocks.step": v.step}
    )
    live_outputs = v.live_outputs()

    def run(job) -> dict:
        return v.shown(capture_prompt(job), "this prompt", job.req.block_size)

    checked, ran = block_view.with_(run=run).button(
        ctx, v.run_btn, [v.prompt, v.chat, v.max_new, v.block_size], live_outputs
    )
    for event in (checked, ran):  # a refused run empties the earlier one's views instead of leaving them unlabelled
        clear_on_refusal(event, [v.source, v.state, *v.view_outputs()])
    pickers = [v.state, v.block_size, v.step, v.layer]
    # redrawn on the visitor's own moves (``input``): a run or the example that sets the step slider sends its views
    # in the same answer, so its ``change`` would draw every chart twice
    for control in (v.block_size, v.step, v.layer):
        control.input(
            lambda *a: v.views(views(*a)),
            pickers,
            v.view_outputs(),
            api_name=False,
            show_progress="hidden",
            trigger_mode="always_last",
        )

    def from_generate(trace, b) -> dict:
        if trace is None or not trace.steps:
            return {v.source: gr.skip()}
        return v.shown(trace, "the latest Generate run", b)

    if ctx.trace_state is not None:
        ctx.on_trace(from_generate, [ctx.trace_state, v.block_size], live_outputs)
    return live_outputs


def blocks(
    ctx: AppContext,
    prompts: list[str],
    chat: bool = True,
    block_size: int = 16,
    policy: str | None = None,
    budget: int | None = None,
) -> tuple:
    """Blocks, prefix sharing and eviction × paging: the JSON of ``python -m kvviz blocks --json``.

    Args:
        prompts: one to four prompts (a list of plain-text strings); shared leading blocks are counted once.
        chat: true wraps each prompt in the model's chat template.
        block_size: tokens per KV block (a paged cache's page size), a whole number.
        policy: an eviction policy applied to each prompt's prefill, e.g. snapkv (omitted: no eviction).
        budget: with policy, cache entries kept per layer and KV head, in tokens.

    Returns:
        Blocks per prompt, blocks shared between prompts and bytes held (all sizes in bytes).
    """
    b = block_size_of(block_size)
    texts = blocks_sharing.check_prompts(ctx, prompts)
    pol = blocks_eviction.check_policy(policy, budget)
    ids = blocks_sharing.token_ids(ctx, texts, chat)
    return BlocksAsk(tuple(texts), bool(chat), b, pol, None if pol is None else int(budget), tuple(ids))


@dataclass(frozen=True)
class BlocksAsk:
    """A checked ``/blocks`` request: the prompts, chat, block size, policy and budget (None: no eviction),
    and each prompt's token ids (for its cost)."""

    texts: tuple
    chat: bool
    block_size: int
    policy: object
    budget: int | None
    ids: tuple


def blocks_json(job) -> dict:
    """The CLI's JSON for one to four prompts (and optionally a policy and budget)."""
    a: BlocksAsk = job.req
    named = [(f"prompt {i + 1}", t) for i, t in enumerate(a.texts)]
    return blocks_report(job.ctx.lm, named, a.chat, a.block_size, a.policy, a.budget)


def _blocks_size(a: BlocksAsk) -> Size:
    return Size(max(map(len, a.ids)), 1, runs=len(a.ids) * (2 if a.policy is not None else 1))


# the ``/blocks`` endpoint (and ``api_blocks(ctx, prompts, …)`` in tests)
api_blocks = ModelJob("block view", check=blocks, run=blocks_json, size=_blocks_size)
