"""Tiny random-weight models built from configs, for architecture coverage (never a stand-in for the real model).

One config dict per architecture transformers ships for causal LMs with a distinct attention: hidden
64, 4 query heads of 16, 2–3 layers, vocabulary 256 (the byte tokenizer's), so the whole matrix runs
in seconds. ``kvviz.capture.architectures.build`` turns a dict into a model; nothing is downloaded.
"""

from __future__ import annotations

import copy

from kvviz.capture.architectures import build
from kvviz.models import LoadedModel

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}  # gpt-oss / DeepSeek default to YaRN
HYBRID = ["sliding_attention", "full_attention", "sliding_attention"]
MLA = dict(
    num_key_value_heads=4,
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=4,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
)

CONFIGS: dict[str, dict] = {
    "llama": dict(model_type="llama", **COMMON, num_key_value_heads=2),
    "llama_mqa": dict(model_type="llama", **{**COMMON, "num_hidden_layers": 3}, num_key_value_heads=1),
    "qwen2": dict(model_type="qwen2", **COMMON, num_key_value_heads=2),
    "qwen3": dict(model_type="qwen3", **{**COMMON, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=32),
    "qwen3_moe": dict(model_type="qwen3_moe", **COMMON, **MOE, num_key_value_heads=2, num_experts=4),
    "mistral": dict(
        model_type="mistral", **{**COMMON, "num_hidden_layers": 3}, num_key_value_heads=2, sliding_window=8
    ),
    "mixtral": dict(model_type="mixtral", **COMMON, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "gemma2": dict(
        model_type="gemma2",
        **{**COMMON, "num_hidden_layers": 3},
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        layer_types=HYBRID,
    ),  # soft-capping 50 by default
    "gemma3": dict(
        model_type="gemma3_text",
        **{**COMMON, "num_hidden_layers": 3},
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        query_pre_attn_scalar=24,
        layer_types=HYBRID,
    ),
    "phi3": dict(model_type="phi3", **COMMON, num_key_value_heads=2),
    "olmo2": dict(model_type="olmo2", **COMMON, num_key_value_heads=2),
    "granite": dict(model_type="granite", **COMMON, num_key_value_heads=2, attention_multiplier=0.3),
    "cohere": dict(model_type="cohere", **COMMON, num_key_value_heads=2),
    "gpt2": dict(
        model_type="gpt2",
        vocab_size=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=512,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "gpt_neox": dict(model_type="gpt_neox", **COMMON),
    "falcon": dict(
        model_type="falcon",
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        bos_token_id=1,
        eos_token_id=2,
    ),  # multi_query: one K/V head; attention outside the interface
    "falcon_alibi": dict(
        model_type="falcon",
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        alibi=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "bloom": dict(
        model_type="bloom", vocab_size=256, hidden_size=64, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2
    ),  # ALiBi
    "deepseek_v2": dict(model_type="deepseek_v2", **COMMON, **MOE, **ROPE, **MLA),
    "deepseek_v3": dict(model_type="deepseek_v3", **COMMON, **MOE, **ROPE, **MLA),
    "gpt_oss": dict(
        model_type="gpt_oss",
        **{**COMMON, "num_hidden_layers": 3},
        **ROPE,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    "llama4_chunked": dict(
        model_type="llama4_text",
        **{**COMMON, "num_hidden_layers": 4},
        num_key_value_heads=2,
        head_dim=16,
        attention_chunk_size=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        intermediate_size_mlp=128,
        no_rope_layer_interval=4,
    ),  # 3 chunked layers, 1 global
    "cohere2": dict(
        model_type="cohere2", **{**COMMON, "num_hidden_layers": 4}, num_key_value_heads=2, sliding_window=8
    ),
    "gpt_bigcode": dict(
        model_type="gpt_bigcode",
        vocab_size=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=512,
        multi_query=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "smollm3": dict(model_type="smollm3", **{**COMMON, "num_hidden_layers": 4}, num_key_value_heads=2),
    "deepseek_v32": dict(
        model_type="deepseek_v32", **COMMON, **MOE, **ROPE, **MLA, index_topk=4, index_head_dim=16, index_n_heads=2
    ),  # sparse attention: each query reads the 4 keys its indexer selects
    "gemma4": dict(
        model_type="gemma4_text",
        **{**COMMON, "num_hidden_layers": 6},
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 3,
        num_kv_shared_layers=3,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=256,
    ),  # cross-layer KV sharing: layers 3-5 attend to layers 1 and 2's K/V
}
CONFIG_NAMES = sorted(CONFIGS)


def tiny_config(name: str) -> dict:
    return copy.deepcopy(CONFIGS[name])


def tiny_model(name: str, tokenizer=None, attn_implementation: str | None = None) -> LoadedModel:
    """A random-weight model of architecture ``name`` (seed 0); ``tokenizer`` replaces the byte tokenizer."""
    lm = build(tiny_config(name), name=f"tiny-{name}", attn_implementation=attn_implementation)
    if tokenizer is not None:
        lm.tokenizer = tokenizer
    return lm


def recompute_probabilities(monkeypatch) -> None:
    """Make every attention implementation return no probabilities, so the recorder recomputes them
    (as it does behind SDPA, flex and flash kernels) even for eager-only models."""
    from kvviz.capture import attention_fn as attention_fn

    real = attention_fn._implementation

    def implementation(module, impl):
        fn = real(module, impl)
        return lambda *args, **kwargs: (fn(*args, **kwargs)[0], None)

    monkeypatch.setattr(attention_fn, "_implementation", implementation)
