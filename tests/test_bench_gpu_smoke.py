"""bench/gpu_smoke.py end to end on the CPU (small sizes): every step runs and the JSON summary has every key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # loads the model and runs a benchmark
KEYS = {
    "device", "device_name", "torch", "model", "model_dtype", "kv_cache_dtype", "quantized_kv",
    "max_abs_logit_diff", "max_abs_attn_output_diff", "tolerance", "verdict", "bf16_verdict", "decode_tokens_per_s",
    "eviction", "quantized", "room", "p95_s", "tokens_per_s", "peak_gpu_memory_bytes", "seconds",
}  # fmt: skip


def test_gpu_smoke_runs_on_the_cpu_and_prints_the_whole_summary_with_the_bf16_verdict():
    args = ["--device", "cpu", "--students", "3", "--new-tokens", "4", "--prompt-tokens", "160"]
    done = subprocess.run(
        [sys.executable, "bench/gpu_smoke.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert set(out) >= KEYS, sorted(KEYS - set(out))
    assert out["device"] == "cpu" and out["model_dtype"] == "float32" and out["peak_gpu_memory_bytes"] is None
    assert out["max_abs_logit_diff"] < out["tolerance"] == 1e-3  # fp32: cached decoding equals recomputation
    assert out["verdict"]["cache_changes_nothing"] and out["verdict"]["dtype"] == "float32"
    bf16 = out["bf16_verdict"]  # the bf16 path, on the CPU here: the cache changes nothing in bf16 either
    assert bf16["dtype"] == "bfloat16" and bf16["cache_changes_nothing"] is True
    assert 1e-3 < bf16["max_abs_logit_diff"] < bf16["tolerance"] and bf16["positions_checked"] == 4
    assert "[bfloat16 on cpu] **Cached decoding equals full recomputation**" in done.stderr
    assert out["room"]["students"] == 3 and not out["room"]["errors"] and out["tokens_per_s"] > 0
    assert out["eviction"]["cache_bytes"] < out["eviction"]["full_cache_bytes"]
    assert out["quantized"]["packed_bytes"] < out["quantized"]["full_cache_bytes"]
