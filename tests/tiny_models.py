"""Tiny random-weight models built from configs, for architecture coverage (never a stand-in for the real model)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, Gemma2Config, GPT2Config, LlamaConfig, MistralConfig, Qwen3Config

from kvviz.models import LoadedModel, stop_token_ids

VOCAB = 49152  # the bundled tokenizer's vocabulary, so its tokenizer can decode the ids


def _configs() -> dict:
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=512)
    return {
        "gpt2_mha": GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512),
        "llama_mqa": LlamaConfig(**common, num_key_value_heads=1),
        "qwen3_head_dim": Qwen3Config(**common, num_key_value_heads=2, head_dim=32),
        "mistral_sliding": MistralConfig(**common, num_key_value_heads=2, sliding_window=8),
        "gemma2_hybrid": Gemma2Config(**common, num_key_value_heads=2, head_dim=16, sliding_window=8,
                                      layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    }


CONFIG_NAMES = sorted(_configs())


def tiny_model(name: str, tokenizer) -> LoadedModel:
    """A random-weight model of architecture ``name`` sharing the bundled tokenizer."""
    torch.manual_seed(0)
    config = _configs()[name]
    impl = "eager" if name.startswith("gemma2") else "sdpa"  # Gemma-2's soft-capping has no SDPA path
    model = AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.float32).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=f"tiny-{name}", device=torch.device("cpu"),
                       dtype=torch.float32, stop_ids=stop_token_ids(tokenizer, config))
