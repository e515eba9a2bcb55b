"""Blocks tab section: prompts side by side, full blocks shared through a prefix cache keyed by chained hash.

Checks the prompts, admits one job for all of them and calls :func:`kvviz.blocks.live.share_prompts`;
the figures come from :mod:`kvviz.figures.blocks`. No arithmetic here.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from kvviz.blocks.live import share_prompts
from kvviz.capture.model_io import encode_prompt
from kvviz.figures import blocks_sharing as fig
from kvviz.limits import check_prompt_length, prompt_limit
from kvviz.safety import clean_prompt
from kvviz.ui.blocks.checks import block_size_of
from kvviz.ui.page.widgets import captioned_plot, clear_on_refusal, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.job import Size
from kvviz.ui.serving.model_job import ModelJob
from kvviz.ui.serving.sessions import user_errors

MAX_PROMPTS = 4
COURSE = (
    "You are the teaching assistant of the KV-cache lecture. Answer in two sentences, with the lecture's "
    "words: the cache stores each past token's keys and values in every layer, so a decode step processes "
    "only the new token. "
)
DEFAULTS = [
    COURSE + "Student 1 asks: why does the cache grow with every token?",
    COURSE + "Student 2 asks: what does a paged engine store in one block?",
    "",
]


def check_prompts(ctx: AppContext, prompts) -> list[str]:
    """The non-blank prompts, cleaned; at least one, at most :data:`MAX_PROMPTS` (gr.Error otherwise)."""
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
        prompts = [prompts]
    given = [p for p in prompts if p is not None and not (isinstance(p, str) and not p.strip())]
    with user_errors():
        if not given:
            raise ValueError("The prompt is empty: type at least one prompt.")
        if len(given) > MAX_PROMPTS:
            raise ValueError(f"At most {MAX_PROMPTS} prompts at once; got {len(given)}.")
        return [clean_prompt(p, ctx.settings.max_prompt_chars) for p in given]


def token_ids(ctx: AppContext, texts: list[str], chat) -> list[list[int]]:
    """Each prompt's token ids, each within the prompt limit."""
    limit = prompt_limit(ctx.settings.max_prompt_tokens, ctx.info.context_length)
    out = []
    with user_errors():
        for i, text in enumerate(texts):
            ids = encode_prompt(ctx.lm, text, bool(chat))
            check_prompt_length(len(ids), 0, limit, f"Prompt {i + 1}")
            out.append(ids)
    return out


@dataclass(frozen=True)
class SharingAsk:
    """A checked prefix-sharing run: the block size and each prompt's token ids."""

    block_size: int
    ids: tuple


def build(ctx: AppContext, block_size: gr.Radio) -> None:
    """The section, inside the Blocks tab (``block_size`` is the tab's block-size control)."""

    gr.Markdown(
        "### Prefix sharing\nTwo students send chat requests that start the same way. A paged engine with "
        "a prefix cache hashes each full block together with the hash of the block before it (vLLM's "
        "chained hash), finds the leading blocks an earlier request already computed, and reuses them: "
        "drawn once below, shared by both block tables."
    )
    boxes = [
        gr.Textbox(
            text, label=f"Prompt {i + 1}" + (" (optional)" if i >= 2 else ""), lines=2, elem_id=f"share-prompt-{i + 1}"
        )
        for i, text in enumerate(DEFAULTS)
    ]
    with gr.Row():
        chat = gr.Checkbox(
            True, label="Use the chat template (its system prompt is a shared prefix too)", elem_id="share-chat"
        )
        button = gr.Button("Share blocks", variant="primary", elem_id="share-run")
    summary = gr.Markdown(elem_id="share-summary")
    figure = captioned_plot("Block tables over one pool", "share-figure", fig.CAPTIONS["sharing"])
    table = gr.Dataframe(
        waiting_table("Press Share blocks to see what each prompt reuses"),
        label="Per prompt",
        interactive=False,
        elem_id="share-table",
    )
    gr.Markdown(fig.CAPTIONS["sharing_table"], elem_classes="caption")
    ctx.components.update({"blocks.share_run": button})

    def request_of(_ctx, b, use_chat, *texts) -> SharingAsk:
        size = block_size_of(b)
        prompts = check_prompts(ctx, list(texts))
        return SharingAsk(size, tuple(token_ids(ctx, prompts, use_chat)))

    def run(job) -> dict:
        a: SharingAsk = job.req
        names = [f"prompt {i + 1}" for i in range(len(a.ids))]
        s = share_prompts(ctx.lm, list(a.ids), a.block_size, names, should_stop=job.cancel)
        return {summary: fig.sharing_summary(s), figure: fig.sharing_figure(s), table: fig.sharing_table(s)}

    sharing = ModelJob(
        "prefix sharing",
        check=request_of,
        run=run,
        size=lambda a: Size(max(map(len, a.ids)), 1, runs=len(a.ids)),
    )
    for event in sharing.button(ctx, button, [block_size, chat, *boxes], [summary, figure, table]):
        clear_on_refusal(event, [summary, figure, table])
