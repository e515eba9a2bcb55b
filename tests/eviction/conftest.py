"""Fixtures shared by the eviction tests."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from kvviz.eviction.cache import EvictingCache


@pytest.fixture
def tiny_cache():
    """A two-layer evicting cache (2 KV heads, head_dim 8) loaded with a random 6-token prefill."""
    config = LlamaConfig(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, head_dim=8, vocab_size=16
    )
    cache = EvictingCache(config)
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(2, 6, 8, generator=g) for _ in range(2)]
    values = [torch.randn(2, 6, 8, generator=g) for _ in range(2)]
    return cache.load(keys, values), keys, values
