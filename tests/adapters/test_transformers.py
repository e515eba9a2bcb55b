"""Canaries: the transformers internals behind :mod:`kvviz.adapters.transformers` still mean what kvviz assumes."""

from __future__ import annotations

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

from kvviz.adapters import transformers as adapter
from tests.tiny_models import tiny_model


def test_mask_functions_are_found_by_implementation_name():
    assert isinstance(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, dict), (
        "AttentionMaskInterface._global_mapping moved"
    )
    assert adapter.mask_function("sdpa") is sdpa_mask
    assert adapter.mask_function("eager") is eager_mask
    assert adapter.mask_function("no-such-implementation") is sdpa_mask


def test_the_forced_implementation_is_the_one_the_forward_calls():
    lm = tiny_model("llama")
    model = lm.model
    assert adapter.attn_implementation(model.config) == "sdpa"
    calls = []

    def counting(module, query, key, value, attention_mask, **kwargs):
        calls.append(module.layer_idx)
        return AttentionInterface._global_mapping["sdpa"](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("kvviz_canary", counting)
    ALL_MASK_ATTENTION_FUNCTIONS.register("kvviz_canary", adapter.mask_function("sdpa"))
    try:
        adapter.force_attn_implementation(model.config, "kvviz_canary")
        assert adapter.attn_implementation(model.config) == "kvviz_canary"
        with torch.inference_mode():
            model(input_ids=torch.tensor([[3, 4, 5]]), use_cache=False)
    finally:
        adapter.force_attn_implementation(model.config, "sdpa")
    assert calls == list(range(model.config.num_hidden_layers)), (
        "config._attn_implementation no longer routes attention"
    )


def test_legacy_attention_is_told_apart():
    assert hasattr(PreTrainedModel, "_can_set_attn_implementation"), (
        "PreTrainedModel._can_set_attn_implementation moved"
    )
    assert adapter.uses_attention_interface(tiny_model("llama").model)
    assert not adapter.uses_attention_interface(tiny_model("bloom").model)  # Falcon joined the interface in 5.25


def test_dsa_leaves_its_selection_to_a_kernel_under_another_name():
    """DeepSeek-V3.2 folds its indexer's top-k into the mask only for "eager"/"sdpa"; under the capture's own
    name it passes ``indices`` instead, which :func:`~kvviz.adapters.transformers.fold_sparse_indices` masks."""
    lm = tiny_model("deepseek_v32")
    model = lm.model
    seen = []

    def spying(module, query, key, value, attention_mask, **kwargs):
        seen.append(kwargs.get("indices"))
        mask = adapter.fold_sparse_indices(attention_mask, kwargs.pop("indices"), key.shape[-2], query.dtype)
        return AttentionInterface._global_mapping["sdpa"](module, query, key, value, mask, **kwargs)

    ids = torch.tensor([list(range(3, 15))])
    with torch.inference_mode():
        own = model(input_ids=ids, use_cache=False).logits
    AttentionInterface.register("kvviz_canary_dsa", spying)
    ALL_MASK_ATTENTION_FUNCTIONS.register("kvviz_canary_dsa", adapter.mask_function("sdpa"))
    try:
        adapter.force_attn_implementation(model.config, "kvviz_canary_dsa")
        with torch.inference_mode():
            folded = model(input_ids=ids, use_cache=False).logits
    finally:
        adapter.force_attn_implementation(model.config, "sdpa")
    assert all(i is not None and i.shape == (1, 12, 4) for i in seen), "DSA no longer passes indices= to kernels"
    torch.testing.assert_close(folded, own)  # folded as the model folds them for SDPA
