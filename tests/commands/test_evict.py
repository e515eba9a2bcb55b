"""The ``python -m kvviz evict`` contract: JSON fields, kept sets, bytes, exit codes and messages."""

from __future__ import annotations

import json
import subprocess
import sys

from kvviz.__main__ import main

PROMPT = "Write one sentence about the sea."


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvviz", "evict", *args], capture_output=True, text=True, timeout=300)


def test_json_contract_streaming(lm):
    res = _run(
        "--prompt",
        PROMPT,
        "--chat",
        "--policy",
        "streaming_llm",
        "--budget",
        "12",
        "--sinks",
        "2",
        "--max-new-tokens",
        "4",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert {"policy", "prompt_tokens", "n_kept", "kept", "text", "cache_bytes", "full_cache_bytes"} <= set(data)
    assert data["policy"] == "streaming_llm" and data["n_kept"] == 12 and data["params"]["sinks"] == 2
    n = data["prompt_tokens"]
    expected = [0, 1, *range(n - 10, n)]
    assert len(data["kept"]) == 30 and all(len(layer) == 3 for layer in data["kept"])
    assert all(head == expected for layer in data["kept"] for head in layer)
    per_token = 2 * 30 * 3 * 64 * 4
    assert data["cache_bytes"] == 12 * per_token  # StreamingLLM stays at its budget while decoding
    assert data["full_cache_bytes"] == (n + data["generated_tokens"] - 1) * per_token
    assert isinstance(data["text"], str) and data["text"]


def test_json_contract_snapkv_ratio(lm, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("The meeting moved to Thursday at noon in room B. " * 6, encoding="utf-8")
    res = _run(
        "--prompt-file",
        str(prompt),
        "--policy",
        "snapkv",
        "--ratio",
        "0.5",
        "--window-size",
        "8",
        "--kernel-size",
        "3",
        "--max-new-tokens",
        "3",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    n = data["prompt_tokens"]
    assert data["n_kept"] == max(1, int(n * 0.5))
    for layer in data["kept"]:
        for head in layer:
            assert head == sorted(head) and len(head) == data["n_kept"]
            assert head[-8:] == list(range(n - 8, n)), "SnapKV keeps its observation window"
    assert len({tuple(h) for layer in data["kept"] for h in layer}) > 1, "per layer and KV head"


def _main(capsys, *args: str) -> tuple[int, str]:
    """Exit code and stderr of the command run in-process (no new interpreter: the error paths are quick)."""
    try:
        code = main(["evict", *args])
    except SystemExit as exc:  # argparse refuses before run()
        code = exc.code
    return code, capsys.readouterr().err


def test_flags_of_another_policy_are_refused(capsys):
    code, err = _main(capsys, "--prompt", PROMPT, "--policy", "streaming_llm", "--budget", "8", "--window-size", "4")
    assert code == 2 and "--window-size does not apply" in err


def test_budget_and_ratio_are_exclusive(capsys):
    code, err = _main(capsys, "--prompt", PROMPT, "--policy", "h2o", "--budget", "8", "--ratio", "0.5")
    assert code != 0 and "not allowed with" in err


def test_snapkv_budget_below_its_window_says_what_to_do(lm, capsys):
    code, err = _main(
        capsys, "--prompt", "word " * 100, "--policy", "snapkv", "--budget", "16", "--max-new-tokens", "1"
    )
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error: SnapKV") and "window_size" in last


def test_empty_prompt_is_an_error(capsys):
    code, err = _main(capsys, "--prompt", "  ", "--policy", "full", "--budget", "4")
    assert code == 2 and "empty" in err
