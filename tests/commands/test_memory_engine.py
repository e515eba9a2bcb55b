"""``python -m kvviz memory --block-size --max-model-len``: the `engine` object, the other keys unchanged."""

from __future__ import annotations

import json

from kvviz.__main__ import main

ARGS = ["memory", "--preset", "Llama-3-70B", "--gpu", "H100", "--gpus", "8", "--weights-gb", "140", "--json"]


def _json(capsys, *extra: str) -> dict:
    assert main([*ARGS, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_engine_object_and_unchanged_keys(capsys):
    plain = _json(capsys)
    paged = _json(capsys, "--block-size", "16", "--max-model-len", "8192")
    engine = paged.pop("engine")
    assert paged == plain
    assert engine["block_size"] == 16 and engine["kv_bytes_per_gpu"] == 54_500_000_000
    assert engine["bytes_per_block_per_gpu"] == 655_360 and engine["num_blocks"] == 83_160
    assert engine["kv_cache_tokens"] == 83_160 * 16 == 1_330_560
    assert engine["max_concurrency"] == engine["kv_cache_tokens"] / 8192
    assert "GPU KV cache size: 1,330,560 tokens" in engine["log"]
    assert "Maximum concurrency for 8,192 tokens per request: 162.42x" in engine["log"]


def test_engine_defaults_to_the_config_context_and_prints_the_log(capsys):
    assert main(ARGS[:-1] + ["--block-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "INFO GPU KV cache size: 1,330,560 tokens" in out  # 41,580 blocks of 32
    assert "Maximum concurrency for 8,192 tokens per request" in out  # the preset's 8,192


def test_engine_needs_gpu_memory(capsys):
    assert main(["memory", "--preset", "Llama-3-70B", "--block-size", "16"]) == 2
    assert "need the GPU memory" in capsys.readouterr().err
