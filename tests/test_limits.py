"""kvviz.limits: every config number bounded, calculator inputs checked, a job's cost known before it runs."""

from __future__ import annotations

import math

import pytest

from kvviz.limits import CONFIG_BOUNDS, bounded_int, calculator_number, check_cost, config_int, job_cost


@pytest.mark.parametrize(
    "value, message",
    [
        (10**9, r"'num_hidden_layers' = 1000000000 is outside the allowed range 1 … 1,024"),
        (-3, r"outside the allowed range 1 … 1,024"),
        (0, r"outside the allowed range"),
        (2.5, r"must be a whole number in 1 … 1,024; got 2.5"),
        ("32", r"must be a whole number"),
        (True, r"must be a whole number"),
        (math.nan, r"must be a whole number"),
        (math.inf, r"must be a whole number"),
    ],
)
def test_config_numbers_are_refused_outside_their_bounds(value, message):
    with pytest.raises(ValueError, match=message):
        config_int({"num_hidden_layers": value}, "num_hidden_layers")


def test_every_bound_admits_real_models():
    real = {
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "hidden_size": 16384,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "sliding_window": 4096,
        "max_position_embeddings": 10_485_760,
    }
    for name, value in real.items():
        assert config_int(real, name) == value
    assert config_int({}, "head_dim", 7) == 7
    assert all(lo <= hi for lo, hi in CONFIG_BOUNDS.values())


def test_whole_floats_are_accepted_as_counts():
    assert bounded_int(32.0, "layers", 1, 64) == 32


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("context", 0, "Context = 0 is outside"),
        ("context", 1e300, "outside the allowed range"),
        ("batch", 1.5, "whole number"),
        ("batch", "lots", "whole number"),
        ("gpu_mem_gb", -1, "outside the allowed range 0.001"),
        ("gpu_mem_gb", math.nan, "must be a number"),
        ("reserve", 0.99, "outside the allowed range 0 … 0.95"),
    ],
)
def test_calculator_inputs(name, value, message):
    with pytest.raises(ValueError, match=message):
        calculator_number(name, value, name.capitalize() if name == "context" else None)


def test_calculator_numbers_pass_through_when_valid():
    assert calculator_number("context", "8192") == 8192
    assert calculator_number("gpu_mem_gb", "80") == 80.0


def test_job_cost_counts_prefill_and_decode_reads():
    cost = job_cost(prompt_tokens=4, new_tokens=2, layers=3, bytes_per_token=10)
    # prefill 4·5/2 = 10 keys; decode reads 5 and then 6 keys = 4·2 + 2·3/2 = 11 → 21 per layer
    assert cost.key_reads == 3 * 21
    assert cost.token_passes == 3 * 6 and cost.bytes == 2 * 6 * 10
    assert job_cost(4, 2, 3, 10, runs=3).key_reads == 3 * cost.key_reads


def test_a_bounded_cache_caps_the_keys_each_step_reads():
    capped = job_cost(prompt_tokens=4, new_tokens=6, layers=1, bytes_per_token=10, window=6)
    # prefill 10; steps see 5, 6, then 6, 6, 6, 6 keys (the cache holds 6) = 35; bytes for 6 held tokens
    assert capped.key_reads == 10 + 35 and capped.bytes == 2 * 6 * 10
    assert job_cost(4, 6, 1, 10, window=100).key_reads == job_cost(4, 6, 1, 10).key_reads


def test_check_cost_names_what_to_shrink():
    cost = job_cost(8192, 512, 30, 46080)
    check_cost(cost, cost.key_reads, None)
    with pytest.raises(ValueError, match="too large for this deployment.*8,192 prompt \\+ 512 new tokens"):
        check_cost(cost, cost.key_reads - 1, None)
    with pytest.raises(ValueError, match="can spare 1 MiB"):
        check_cost(cost, cost.key_reads, 2**20)
