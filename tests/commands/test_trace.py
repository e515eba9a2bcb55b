"""The ``python -m kvviz trace`` contract: JSON fields, exit codes, messages."""

from __future__ import annotations

import json
import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvviz", "trace", *args], capture_output=True, text=True, timeout=300)


def test_json_contract(tmp_path, lm):
    out = tmp_path / "t.npz"
    res = _run(
        "--prompt", "What is the capital of France?", "--chat", "--max-new-tokens", "12", "--json", "--out", str(out)
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["model"] == {
        **data["model"],
        "name": "SmolLM2-135M-Instruct",
        "layers": 30,
        "q_heads": 9,
        "kv_heads": 3,
        "head_dim": 64,
        "dtype": "float32",
        "bytes_per_element": 4,
    }
    assert "Paris" in data["text"]
    assert data["generated_tokens"] == len(data["steps"])
    assert data["steps"][0]["cache_lens"] == [data["prompt_tokens"]] * 30
    assert all(s["cache_bytes"] == s["cache_lens"][0] * data["kv_bytes_per_token"] for s in data["steps"])
    assert data["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4
    assert data["max_abs_logit_diff_vs_recompute"] < 1e-3
    assert out.exists()


def test_empty_prompt_is_an_error():
    res = _run("--prompt", "   ", "--json")
    assert res.returncode != 0 and "empty" in res.stderr


def test_too_many_tokens_is_a_one_line_error():
    res = _run("--prompt", "Hi", "--max-new-tokens", "100000")  # fails after the model has loaded
    assert res.returncode != 0 and "context" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr  # no loading bar above it when piped


def test_bad_model_is_a_one_line_error(tmp_path):
    res = _run("--prompt", "Hi", "--model", str(tmp_path / "no-such-model"))
    assert res.returncode != 0
    assert "Could not load model" in res.stderr and len(res.stderr.strip().splitlines()) == 1
