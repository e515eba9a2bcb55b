"""``python -m kvviz memory``: the JSON contract, the human output, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


def kvviz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvviz", "memory", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def as_json(*args: str) -> dict:
    out = kvviz(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_json_contract_basic():
    r = as_json("--preset", "Llama-3-70B", "--context", "131072")
    for key in ("bytes_per_token", "bytes_per_sequence", "total_bytes", "layers"):
        assert key in r
    assert r["bytes_per_token"] == 327_680
    assert r["bytes_per_sequence"] == 40 * GiB == r["total_bytes"]
    assert len(r["layers"]) == 80
    assert r["layers"][0] == {"kind": "full", "tokens_held": 131_072, "bytes": 131_072 * 4096}
    assert "kv_budget_bytes" not in r and "decode_ms_kv" not in r  # only when asked for


def test_json_contract_chapter_serving_example():
    r = as_json(
        "--preset",
        "Llama-3-70B",
        "--context",
        "8192",
        "--batch",
        "162",
        "--gpus",
        "8",
        "--gpu-mem-gb",
        "80",
        "--reserve",
        "0.1",
        "--weights-gb",
        "140",
        "--bandwidth-tbps",
        "3.35",
    )
    assert r["kv_budget_bytes"] == 436 * 10**9
    assert r["max_sequences"] == 162
    assert r["total_bytes"] == 162 * 8192 * 327_680
    assert round(r["decode_ms_weights"], 1) == 5.2 and round(r["decode_ms_kv"]) == 16
    assert r["tp"] == 8 and r["replication"] == 1


def test_json_128k_fits_ten():
    r = as_json(
        "--preset", "Llama-3-70B", "--context", "131072", "--gpus", "8", "--gpu-mem-gb", "80", "--weights-gb", "140"
    )
    assert r["max_sequences"] == 10


def test_json_fp8_and_tp_replication():
    fp8 = as_json("--preset", "Llama-3-8B", "--context", "1", "--kv-dtype", "fp8")
    assert fp8["bytes_per_token"] == 64 * 1024
    rep = as_json("--preset", "Llama-3-70B", "--context", "8192", "--tp", "16")
    assert rep["replication"] == 2 and rep["total_bytes"] == 5 * GiB


def test_json_sliding_layers_report_their_window():
    r = as_json("--preset", "gpt-oss-20b", "--context", "100000")
    kinds = {(layer["kind"], layer["tokens_held"]) for layer in r["layers"]}
    assert kinds == {("sliding", 127), ("full", 100_000)}
    assert r["bytes_per_sequence"] == sum(layer["bytes"] for layer in r["layers"])


def test_config_file(tmp_path):
    cfg = {
        "model_type": "qwen3",
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_size": 1024,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = as_json("--config", str(path), "--context", "32768")
    assert r["bytes_per_sequence"] == 1_879_048_192  # the article's Qwen3-0.6B arithmetic


def test_gpu_preset_fills_memory_and_bandwidth():
    r = as_json("--preset", "SmolLM2-135M", "--gpu", "T4", "--context", "8192")
    assert r["gpu_mem_bytes"] == 16 * 10**9 and r["bandwidth_bytes_per_s"] == pytest.approx(0.32e12)
    assert r["max_sequences"] > 0 and r["decode_ms_kv"] > 0


def test_human_output_has_units():
    out = kvviz(
        "--preset",
        "Llama-3-70B",
        "--context",
        "8192",
        "--batch",
        "162",
        "--gpus",
        "8",
        "--gpu-mem-gb",
        "80",
        "--weights-gb",
        "140",
        "--bandwidth-tbps",
        "3.35",
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for piece in (
        "320 KiB",
        "2.5 GiB",
        "436 GB",
        "406.1 GiB",
        "162 sequences",
        "5.22 ms",
        "16.23 ms",
        "2 × 8 KV heads × 128 × 2 B",
    ):
        assert piece in text, piece


def test_list():
    out = kvviz("--list")
    assert out.returncode == 0 and "Llama-3-70B" in out.stdout and "H100" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "Llama-9"], "Unknown preset"),
        (["--config", "/no/such/config.json"], "no such file"),
        (["--preset", "Llama-3-8B", "--kv-dtype", "fp6"], "Unknown KV dtype"),
        (["--preset", "Llama-3-8B", "--context", "-5"], "context"),
        (["--preset", "Llama-3-8B", "--batch", "0"], "batch"),
        (["--preset", "Llama-3-70B", "--tp", "3"], "cannot split"),
        (["--preset", "Llama-3-70B", "--gpu-mem-gb", "24"], "do not fit"),
        (["--preset", "Llama-3-8B", "--gpu-mem-gb", "80", "--reserve", "1.5"], "reserve"),
        (["--preset", "Llama-3-8B", "--gpus", "2"], "need --gpu-mem-gb"),
        (["--preset", "Llama-3-8B", "--gpu", "V100"], "Unknown GPU"),
        (["--preset", "Llama-3-8B", "--context", "lots"], "invalid int"),
        ([], "required"),
    ],
)
def test_bad_input_exits_non_zero_with_a_message(args, message):
    out = kvviz(*args)
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_config_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{ nope")
    out = kvviz("--config", str(bad))
    assert out.returncode != 0 and "not valid JSON" in out.stderr
