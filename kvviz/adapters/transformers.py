"""transformers internals kvviz relies on: the attention implementation a model runs, and mask functions.

transformers has no public getter for the implementation a loaded model uses (``config._attn_implementation``),
nor for the mask function registered under a name (``AttentionMaskInterface._global_mapping``); public
``set_attn_implementation`` refuses models whose attention bypasses the interface (Falcon, Bloom), so
those are switched through the config attribute, as transformers' own tests do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask


def attn_implementation(config) -> str | None:
    """The attention implementation a model loaded with ``config`` runs ("sdpa", "eager", a registered name)."""
    return getattr(config, "_attn_implementation", None)


def force_attn_implementation(config, name: str) -> None:
    """Make the model read ``name`` as its implementation, without the checks ``set_attn_implementation`` makes."""
    config._attn_implementation = name


def mask_function(impl: str) -> Callable:
    """The mask function transformers gives implementation ``impl`` (SDPA's mask for names it does not know)."""
    return cast(Callable, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(impl, sdpa_mask))


def uses_attention_interface(model) -> bool:
    """Whether the model's attention goes through transformers' AttentionInterface (transformers' own test)."""
    can_set = getattr(type(model), "_can_set_attn_implementation", None)
    return bool(can_set()) if can_set is not None else True


def fold_sparse_indices(attention_mask, indices, key_len: int, dtype):
    """DeepSeek sparse attention's selected keys folded into the mask, as its attention does for eager and SDPA.

    ``DeepseekV32Attention`` masks the keys its indexer did not select only when the implementation is
    named "eager" or "sdpa"; under any other name (kvviz's wrapper) it passes the top-k positions as
    ``indices`` ([B, q, topk]) for a sparse kernel. The wrapper runs eager or SDPA, so it masks them the same way.
    """
    import torch

    b, q = indices.shape[:2]
    unselected = indices.new_ones((b, q, key_len), dtype=torch.bool).scatter(-1, indices.long(), False).unsqueeze(1)
    if attention_mask.dtype == torch.bool:
        return attention_mask & ~unselected
    return attention_mask.masked_fill(unselected, torch.finfo(dtype).min)
