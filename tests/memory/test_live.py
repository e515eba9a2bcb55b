"""The formula against the bytes of real transformers caches: the bundled model and tiny random-weight ones."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    DynamicCache,
    Gemma2Config,
    GPT2Config,
    GPTBigCodeConfig,
    GptOssConfig,
    LlamaConfig,
    MambaConfig,
    MistralConfig,
    Qwen3Config,
    Qwen3NextConfig,
)

from kvviz.memory.estimate import estimate, live_cache_bytes_formula
from kvviz.memory.layout import cache_layout

PROMPT = 20  # longer than the sliding windows of 8
COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)


def _configs() -> dict:
    return {
        "gpt2_mha": GPT2Config(
            vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=512, bos_token_id=1, eos_token_id=2
        ),
        "bigcode_mqa": GPTBigCodeConfig(
            vocab_size=256,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=512,
            multi_query=True,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "llama_mqa": LlamaConfig(**COMMON, num_key_value_heads=1),
        "qwen3_head_dim": Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=32),
        "mistral_sliding": MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=8),
        "gemma2_hybrid": Gemma2Config(**COMMON, num_key_value_heads=2, head_dim=16, sliding_window=8),
        "gpt_oss_banded": GptOssConfig(
            **{**COMMON, "num_hidden_layers": 4},
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=8,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        "deepseek_v3_mla": DeepseekV3Config(
            **{**COMMON, "num_hidden_layers": 2},
            **MOE,
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
        "qwen3_next_linear": Qwen3NextConfig(
            **{**COMMON, "num_hidden_layers": 4},
            **MOE,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            num_experts=4,
            shared_expert_intermediate_size=32,
        ),
        "mamba_state": MambaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, state_size=8),
    }


def _measure(cache) -> tuple[list[int], list[int], list[int]]:
    """Per layer: tokens held, key+value tensor bytes, fixed-state tensor bytes (not a formula)."""
    held, kv, state = [], [], []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        present = keys is not None and keys.numel() > 0
        held.append(int(keys.shape[-2]) if present else 0)
        kv.append(keys.numel() * keys.element_size() + values.numel() * values.element_size() if present else 0)
        tensors = [t for d in ("conv_states", "recurrent_states") for t in (getattr(layer, d, None) or {}).values()]
        state.append(sum(t.numel() * t.element_size() for t in tensors if t is not None))
    return held, kv, state


def _run(model, ids: torch.Tensor, cache) -> None:
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{kw: cache})


@pytest.fixture(scope="module", params=sorted(_configs()))
def tiny(request):
    torch.manual_seed(0)
    config = _configs()[request.param]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return request.param, model


def test_formula_equals_live_cache_bytes(tiny):
    name, model = tiny
    cache = DynamicCache(config=model.config)
    _run(model, torch.arange(3, 3 + PROMPT)[None], cache)
    for seen in range(PROMPT, PROMPT + 3):  # after the prefill and two decode steps
        held, kv, state = _measure(cache)
        f = live_cache_bytes_formula(model.config, seen, dtype_bytes=4)
        assert f["tokens_held"] == held, name
        assert f["layer_bytes"] == kv, name
        assert f["state_bytes"] == state, name
        assert f["total"] == sum(kv), name
        _run(model, torch.tensor([[5]]), cache)


def test_each_architecture_is_read_as_intended(tiny):
    name, model = tiny
    layout = cache_layout(model.config)
    expected = {
        "gpt2_mha": ("MHA", {"full"}),
        "bigcode_mqa": ("MQA", {"full"}),
        "llama_mqa": ("MQA", {"full"}),
        "qwen3_head_dim": ("GQA", {"full"}),
        "mistral_sliding": ("GQA", {"sliding"}),
        "gemma2_hybrid": ("GQA", {"sliding", "full"}),
        "gpt_oss_banded": ("GQA", {"sliding", "full"}),
        "deepseek_v3_mla": ("MLA", {"mla"}),
        "qwen3_next_linear": ("GQA", {"state", "full"}),
    }
    if name in expected:
        assert (layout.attention, set(layout.kinds)) == expected[name]
    else:
        assert set(layout.kinds) == {"state"}
    if name == "qwen3_head_dim":
        assert layout.head_dim == 32  # stated, not 64 / 4 = 16


def test_bf16_cache_is_half_the_fp32_bytes():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_configs()["gemma2_hybrid"], dtype=torch.bfloat16).eval()
    cache = DynamicCache(config=model.config)
    _run(model, torch.arange(3, 3 + PROMPT)[None], cache)
    _, kv, _ = _measure(cache)
    assert live_cache_bytes_formula(model.config, PROMPT, dtype_bytes=2)["layer_bytes"] == kv
    assert estimate(cache_layout(model.config), PROMPT, kv_dtype="bf16").bytes_per_sequence == sum(kv)


@pytest.mark.slow
def test_bundled_model_cache_equals_the_formula(lm):
    ids = lm.tokenizer(
        "The KV cache stores one key and one value vector per token, per layer and per head.", return_tensors="pt"
    )["input_ids"].to(lm.device)
    cache = DynamicCache(config=lm.config)
    _run(lm.model, ids, cache)
    _run(lm.model, ids[:, -1:], cache)
    seen = ids.shape[1] + 1
    held, kv, _ = _measure(cache)
    bytes_per_element = torch.tensor([], dtype=lm.dtype).element_size()
    f = live_cache_bytes_formula(lm.config, seen, dtype_bytes=bytes_per_element)
    assert held == [seen] * 30 and f["layer_bytes"] == kv
    assert f["total"] == seen * 2 * 30 * 3 * 64 * bytes_per_element  # SmolLM2: 30 layers, 3 KV heads of 64


@pytest.mark.slow
def test_bundled_model_trace_bytes_equal_the_formula(lm):
    """The capture's per-step bytes (what the Generate tab shows) agree with the formula at every step."""
    from kvviz.capture.loop import capture

    trace = capture(lm, "Why cache keys and values?", chat=True, max_new_tokens=4, verify=False)
    bytes_per_element = trace.model.bytes_per_element
    for step in trace.steps:
        seen = step.cache_lens[0]  # every SmolLM2 layer is full attention: it holds every token seen
        assert live_cache_bytes_formula(lm.config, seen, bytes_per_element)["layer_bytes"] == step.layer_bytes
