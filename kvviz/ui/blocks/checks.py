"""The Blocks tab's input checks, shared by its live, sharing and eviction sections (each imports this file)."""

from __future__ import annotations

from kvviz.capture.model_io import encode_prompt
from kvviz.limits import MAX_BLOCK_SIZE, check_prompt_length, prompt_limit
from kvviz.safety import clean_prompt, whole_number
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.sessions import user_errors

BLOCK_SIZES = [8, 16, 32]


def block_size_of(value) -> int:
    """The chosen block size, one of :data:`BLOCK_SIZES` (gr.Error otherwise)."""
    with user_errors():
        b = whole_number(value, "Block size", 1, MAX_BLOCK_SIZE)
        if b not in BLOCK_SIZES:
            raise ValueError(f"Block size must be one of {', '.join(map(str, BLOCK_SIZES))} tokens.")
    return b


def check_prompt(ctx: AppContext, prompt, chat, max_new) -> tuple[str, int, int]:
    """The prompt, its length in tokens and the number of new tokens, checked before any model work."""
    with user_errors():
        text = clean_prompt(prompt, ctx.settings.max_prompt_chars)
        n_new = whole_number(max_new, "Tokens to generate", 1, ctx.settings.max_new_tokens)
        n = len(encode_prompt(ctx.lm, text, bool(chat)))
        check_prompt_length(n, n_new, prompt_limit(ctx.settings.max_prompt_tokens, ctx.info.context_length))
    return text, n, n_new
