"""A paged engine's start-up numbers against hand computation (vLLM v1's rules, see kvviz/memory/paged.py)."""

from __future__ import annotations

import json

import pytest

from kvviz.memory.layout import cache_layout, load_preset
from kvviz.memory.paged import startup


def layout(name: str):
    return cache_layout(load_preset(name))


def test_llama_3_70b_on_8_h100_matches_the_hand_computation():
    s = startup(
        layout("Llama-3-70B"),
        gpus=8,
        gpu_mem_gb=80,
        weight_bytes=140 * 10**9,
        reserve=0.1,
        block_size=16,
        max_model_len=8192,
    )
    # (8 × 80 GB × 0.9 − 140 GB) / 8 GPUs = 54.5 GB per GPU
    assert s.kv_bytes_per_gpu == 54_500_000_000
    # 16 tokens × 1 KV head per GPU (8 heads / TP 8) × (128 + 128) × 2 B × 80 layers
    assert s.bytes_per_block_per_gpu == 16 * 1 * 256 * 2 * 80 == 655_360
    assert s.num_blocks == 83_160  # ⌊54.5e9 / 655,360⌋ (83,160.4)
    assert s.kv_cache_tokens == 1_330_560  # 83,160 × 16
    assert s.blocks_per_request == 512 and s.max_concurrency == pytest.approx(83_160 / 512)
    assert s.max_concurrency == pytest.approx(s.kv_cache_tokens / 8192)  # full attention: tokens / M
    assert s.log.splitlines() == [
        "INFO Available KV cache memory: 50.76 GiB",
        "INFO # GPU blocks: 83160",
        "INFO GPU KV cache size: 1,330,560 tokens",
        "INFO Maximum concurrency for 8,192 tokens per request: 162.42x",
    ]
    assert s.advice == ""
    formulas = dict(s.formulas())
    assert "8 × 80 GB × (1 − 0.1 reserve) − 140.00 GB weights" in formulas["Available KV cache memory: 50.76 GiB"]
    assert (
        "16 tokens × 1 KV head per GPU × (2 × 128) × 2 B = 8,192 B per layer × 80 layers"
        in formulas["# GPU blocks: 83160"]
    )


def test_gemma_2_hybrid_counts_each_layer_group():
    lay = layout("gemma-2-9b")
    weights = lay.num_parameters * 2  # 18,483,411,968 B in bf16
    s = startup(lay, gpus=1, gpu_mem_gb=80, weight_bytes=weights, block_size=16, max_model_len=8192)
    assert s.kv_bytes_per_gpu == 72 * 10**9 - 18_483_411_968 == 53_516_588_032
    # 21 sliding + 21 full layers → 2 groups of 21; a block = one 16-token page in each of 21 layers
    assert [(k.kind, k.layers, k.groups) for k in s.kinds] == [("sliding", 21, 1), ("full", 21, 1)]
    assert s.bytes_per_block_per_gpu == 16 * 8 * 512 * 2 * 21 == 2_752_512
    assert s.num_blocks == 19_442 and s.kv_cache_tokens == 19_442 // 2 * 16 == 155_536
    # sliding: ⌈min(4096 − 1 + 2048, 8192) / 16⌉ + 1 = 384 + 1; full: 8192 / 16
    assert [k.blocks_per_request for k in s.kinds] == [385, 512] and s.blocks_per_request == 897
    assert s.log.splitlines()[-1] == "INFO Maximum concurrency for 8,192 tokens per request: 21.67x"


def test_gpt_oss_20b_with_tensor_parallelism():
    s = startup(
        layout("gpt-oss-20b"),
        gpus=2,
        gpu_mem_gb=80,
        weight_bytes=13 * 10**9,
        block_size=16,
        max_model_len=8192,
        max_num_batched_tokens=2048,
    )
    assert s.kv_bytes_per_gpu == (2 * 72 - 13) * 10**9 // 2 == 65_500_000_000
    # 8 KV heads / TP 2 = 4 per GPU, head_dim 64: page 16 × 4 × 128 × 2 B; 12 sliding + 12 full layers
    assert s.bytes_per_block_per_gpu == 16 * 4 * 128 * 2 * 12 == 196_608
    assert s.num_blocks == 333_150 and s.kv_cache_tokens == 166_575 * 16 == 2_665_200
    # sliding (window 128): ⌈min(127 + 2048, 8192) / 16⌉ + 1 = 136 + 1
    assert s.blocks_per_request == 137 + 512
    assert s.log.splitlines()[-1] == "INFO Maximum concurrency for 8,192 tokens per request: 513.33x"


def test_less_than_one_request_says_what_to_change():
    s = startup(
        layout("Llama-3-8B"), gpus=1, gpu_mem_gb=24, weight_bytes=16 * 10**9, block_size=16, max_model_len=131_072
    )
    assert s.max_concurrency < 1
    assert s.fitting_model_len() == s.num_blocks * 16
    assert "--max-model-len (to at most" in s.advice and "fp8" in s.advice


def test_pipeline_stages_split_the_layers_and_fp8_halves_the_page():
    full = startup(
        layout("Llama-3-70B"), gpus=16, gpu_mem_gb=80, weight_bytes=140 * 10**9, tp=8, block_size=16, max_model_len=8192
    )
    assert full.pp == 2 and full.bytes_per_block_per_gpu == 655_360 // 2
    fp8 = startup(
        layout("Llama-3-70B"),
        gpus=8,
        gpu_mem_gb=80,
        weight_bytes=140 * 10**9,
        kv_dtype="fp8",
        block_size=32,
        max_model_len=8192,
    )
    assert fp8.bytes_per_block_per_gpu == 655_360 and fp8.num_blocks == 83_160 and fp8.kv_cache_tokens == 2 * 1_330_560


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tp": 3}, "multiple of the TP degree"),
        ({"block_size": 0}, "block size"),
        ({"max_model_len": 2.5}, "max_model_len"),
    ],
)
def test_bad_settings_are_refused(kw, message):
    args = dict(gpus=8, gpu_mem_gb=80, weight_bytes=140 * 10**9, block_size=16, max_model_len=8192) | kw
    with pytest.raises(ValueError, match=message):
        startup(layout("Llama-3-70B"), **args)


def test_json_carries_the_contract_keys():
    s = startup(
        layout("Llama-3-70B"), gpus=8, gpu_mem_gb=80, weight_bytes=140 * 10**9, block_size=16, max_model_len=8192
    )
    data = json.loads(json.dumps(s.to_json()))
    assert {
        "block_size",
        "kv_bytes_per_gpu",
        "bytes_per_block_per_gpu",
        "num_blocks",
        "kv_cache_tokens",
        "max_concurrency",
        "log",
    } <= set(data)
    assert data["kv_cache_tokens"] == data["num_blocks"] * data["block_size"]
