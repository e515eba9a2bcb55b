"""The ``python -m kvviz blocks`` contract: per-prompt blocks and waste, shared blocks, eviction × paging."""

from __future__ import annotations

import json
import subprocess
import sys

from kvviz.__main__ import main
from kvviz.blocks.hashing import common_prefix

A = "You are a tutor for the KV-cache lecture. Student 1 asks: why does the cache grow with every token?"
B = "You are a tutor for the KV-cache lecture. Student 2 asks: what is a block in a paged KV cache?"


def test_json_contract_two_prompts_with_a_policy(tmp_path):
    files = []
    for name, text in (("a.txt", A), ("b.txt", B)):
        files += ["--prompt-file", str(tmp_path / name)]
        (tmp_path / name).write_text(text, encoding="utf-8")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvviz",
            "blocks",
            *files,
            "--chat",
            "--block-size",
            "8",
            "--policy",
            "streaming_llm",
            "--budget",
            "20",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    a, b = data["prompts"]
    for p in (a, b):
        n = p["prompt_tokens"]
        assert len(p["token_ids"]) == n and p["blocks"] == [-(-n // 8)] * 30
        assert p["wasted_slots"] == -(-n // 8) * 8 - n
        assert len(p["tokens_evicted"]) == 30 and all(h == n - 20 for layer in p["tokens_evicted"] for h in layer)
        # StreamingLLM keeps 4 sinks and the last 16: the blocks entirely between them are freed
        assert all(h == (n - 16) // 8 - 1 for layer in p["blocks_freed"] for h in layer)
    common = common_prefix([a["token_ids"], b["token_ids"]])
    assert data["shared_blocks"] == common // 8 and b["cached_blocks"] == data["shared_blocks"]
    assert data["bytes_per_block"] == 8 * 46_080 and data["bytes_saved"] == data["shared_blocks"] * 8 * 46_080
    assert b["block_ids"][: data["shared_blocks"]] == a["block_ids"][: data["shared_blocks"]]
    assert data["policy"]["name"] == "streaming_llm" and "Page-aligned" in data["policy"]["note"]


def test_one_prompt_without_policy(capsys):
    assert main(["blocks", "--prompt", "Hello there", "--block-size", "32", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (p,) = data["prompts"]
    assert p["blocks"] == [1] * 30 and p["wasted_slots"] == 32 - p["prompt_tokens"]
    assert data["shared_blocks"] == 0 and data["bytes_saved"] == 0 and "tokens_evicted" not in p


def _err(capsys, *args: str) -> tuple[int, str]:
    try:
        code = main(["blocks", *args])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_bad_arguments_are_one_line_errors(capsys):
    assert _err(capsys, "--block-size", "16") == (2, "error: Give at least one --prompt or --prompt-file.\n")
    code, err = _err(capsys, "--prompt", "hi", "--block-size", "0")
    assert code == 2 and "block size" in err
    code, err = _err(capsys, "--prompt", "hi", "--policy", "h2o")
    assert code == 2 and "--policy and --budget go together" in err
    code, err = _err(capsys, "--prompt", "  ")
    assert code == 2 and "empty" in err
