"""The capture benchmarks run end to end at a small size (the 4K targets are reported by the benches, not asserted)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the benchmarks end to end

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield lambda name: importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def test_prompt_is_exactly_n_chapter_tokens(bench, lm):
    common = bench("_common")
    ids = common.chapter_prompt_ids(lm.tokenizer, 7000)  # longer than the chapter: it repeats
    assert len(ids) == 7000
    one = common.chapter_prompt_ids(lm.tokenizer, 100)
    assert ids[:100] == one and lm.tokenizer.decode(one).startswith("3.2 The KV Cache")


def test_trace_memory_smoke(bench, lm, tmp_path):
    tm = bench("trace_memory")
    out = tmp_path / "tm.json"
    result = tm.main(["--prompt-tokens", "96", "--new-tokens", "6", "--out", str(out)], lm=lm)
    saved = json.loads(out.read_text())
    assert saved["prompt_tokens"] == 96 and saved["new_tokens"] == 6 and saved["tokens_in_cache"] == 101
    assert saved["kv_cache_bytes"] == 101 * 2 * 30 * 3 * 64 * 4  # the chapter's formula for SmolLM2 fp32
    assert saved["trace_bytes"] == sum(saved["trace_bytes_by_array"].values()) > 0
    # output_attentions: 30 layers × 9 heads × 4 bytes × (96² prefill + rows of 97 … 101 keys)
    assert saved["output_attentions_bytes"] == 30 * 9 * 4 * (96 * 96 + sum(range(97, 102)))
    assert result["trace_to_kv_ratio"] == pytest.approx(saved["trace_bytes"] / saved["kv_cache_bytes"])


def test_capture_overhead_smoke(bench, lm, tmp_path):
    co = bench("capture_overhead")
    out = tmp_path / "co.json"
    result = co.main(["--cases", "48:4", "--repeats", "1", "--out", str(out)], lm=lm)
    case = json.loads(out.read_text())["cases"][0]
    assert case["same_tokens"] and case["prompt_tokens"] == 48 and case["new_tokens"] == 4
    assert min(case["plain_median_s"], case["own_loop_median_s"], case["capture_median_s"]) > 0
    assert case["ratio_vs_own_loop"] == pytest.approx(case["capture_median_s"] / case["own_loop_median_s"])
    assert result["cases"][0]["ratio_of_medians"] == pytest.approx(case["capture_median_s"] / case["plain_median_s"])
    with pytest.raises(SystemExit):
        co.parse_cases("1024x128")


def test_leaderboard_bench_smoke(bench, lm, tmp_path):
    lb = bench("leaderboard")
    out = tmp_path / "lb.json"
    lb.main(
        [
            "--samples",
            "3",
            "--length",
            "128",
            "--policies",
            "streaming_llm,knorm",
            "--ratios",
            "0,0.5",
            "--max-new-tokens",
            "2",
            "--workers",
            "1",
            "--out",
            str(out),
        ],
        lm=lm,
    )
    saved = json.loads(out.read_text())
    assert [s["task"] for s in saved["samples"]] == ["niah_single", "niah_multikey", "passkey"]  # the tasks in turn
    assert [s["depth"] for s in saved["samples"]] == [0.0, 0.5, 1.0]
    assert saved["bench"]["cells"] == 2 * 2 * 2 and saved["bench"]["wall_s"] > 0
    assert len(saved["records"]) == 3 * 8 and saved["table"]
    assert saved["bench"]["cells_changed_from_stored"] is None  # nothing stored there before


def test_leaderboard_bench_in_two_processes_records_what_one_does(bench, lm, tmp_path):
    lb = bench("leaderboard")
    out = tmp_path / "lb.json"
    argv = ["--samples", "3", "--length", "96", "--policies", "snapkv,kvzip", "--ratios", "0,0.5"]
    argv += ["--max-new-tokens", "2", "--out", str(out)]
    one = lb.main([*argv, "--workers", "1"], lm=lm)
    two = lb.main([*argv, "--workers", "2"])  # two spawned processes, each loading the model
    assert two["bench"]["workers"] == 2 and two["config"]["processes"] == 2
    assert [s["key"] for s in two["samples"]] == [s["key"] for s in one["samples"]]
    assert two["bench"]["cells_changed_from_stored"] == {"answers": 0, "scores": 0, "score_tolerance": 1e-3}, (
        "a sample's cells changed when swept in another process"
    )
    assert len(two["records"]) == len(one["records"]) > 3 * 2 * 2  # SnapKV refuses a few cells of so short a prompt
    assert two["skipped"] == one["skipped"]


def test_debugger_bench_smoke(bench, lm, tmp_path):
    db = bench("debugger")
    out = tmp_path / "db.json"
    result = db.main(["--prompt-tokens", "24", "--new-tokens", "3", "--repeats", "1", "--out", str(out)], lm=lm)
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result)) and saved["prompt_tokens"] == 24 and saved["new_tokens"] == 3
    assert min(saved["run_median_s"], saved["recompute_median_s"], saved["finder_median_s"]) > 0
    assert saved["added_vs_recompute"] == pytest.approx(saved["finder_added_s"] / saved["recompute_median_s"])
