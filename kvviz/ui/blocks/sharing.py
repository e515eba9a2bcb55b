"""Blocks tab section: prompts side by side, full blocks shared through a prefix cache keyed by chained hash.

Checks the prompts, admits one job for all of them and calls :func:`kvviz.blocks.live.share_prompts`;
the figures come from :mod:`kvviz.figures.blocks_sharing`. No arithmetic here.
"""

from __future__ import annotations

import gradio as gr

from kvviz.blocks.live import share_prompts
from kvviz.capture.model_io import encode_prompt
from kvviz.figures import blocks_sharing as fig
from kvviz.safety import clean_prompt
from kvviz.ui.blocks.checks import block_size_of
from kvviz.ui.page.widgets import captioned_plot, waiting_table
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.gpu import gpu
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
    limit = min(ctx.settings.max_prompt_tokens, ctx.info.context_length or 10**9)
    out = []
    with user_errors():
        for i, text in enumerate(texts):
            ids = encode_prompt(ctx.lm, text, bool(chat))
            if len(ids) > limit:
                raise ValueError(f"Prompt {i + 1} is {len(ids):,} tokens; the limit is {limit:,}.")
            out.append(ids)
    return out


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

    def request_of(b, use_chat, *texts):
        size = block_size_of(b)
        prompts = check_prompts(ctx, list(texts))
        return size, prompts, token_ids(ctx, prompts, use_chat)

    def check(b, use_chat, first, second, third, request: gr.Request):
        _, prompts, ids = request_of(b, use_chat, first, second, third)
        ctx.jobs.hold(request, ctx.jobs.admit(request, "prefix sharing", max(map(len, ids)), 1, runs=len(ids)))

    def run(b, use_chat, first, second, third, request: gr.Request):
        size, prompts, ids = request_of(b, use_chat, first, second, third)
        names = [f"prompt {i + 1}" for i in range(len(ids))]
        with (
            ctx.jobs.start(request, "prefix sharing", max(map(len, ids)), 1, runs=len(ids)) as ticket,
            user_errors("Prefix sharing"),
        ):
            s = share_prompts(ctx.lm, ids, size, names, should_stop=ticket.expired)
        return fig.sharing_summary(s), fig.sharing_figure(s), fig.sharing_table(s)

    inputs = [block_size, chat, *boxes]
    button.click(check, inputs, None, api_name=False, show_progress="hidden", concurrency_limit=None).success(
        gpu(run), inputs, [summary, figure, table], api_name=False, concurrency_limit=None
    )
