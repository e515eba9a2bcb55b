"""bench/eviction.py runs end to end at a small size (the 4K comparison itself is reported, not asserted)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_eviction_bench_smoke(lm, tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        bench = importlib.import_module("eviction")
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "ev.json"
    bench.main(
        ["--prompt-tokens", "96", "--new-tokens", "3", "--budget", "72", "--repeats", "1", "--out", str(out)], lm=lm
    )
    saved = json.loads(out.read_text())
    rows = {r["policy"]: r for r in saved["policies"]}
    assert set(rows) == {"full", "streaming_llm", "window", "h2o", "snapkv"}
    per_token = 2 * 30 * 3 * 64 * 4
    assert rows["full"]["cache_bytes_end"] == (96 + 2) * per_token == rows["full"]["full_cache_bytes_end"]
    for name in ("streaming_llm", "window", "h2o"):  # evict while decoding: stay at the budget
        assert rows[name]["cache_bytes_end"] == 72 * per_token
    assert rows["snapkv"]["cache_bytes_end"] == (72 + 2) * per_token  # compressed once, then grows
    assert all(r["decode_tokens_per_s"] > 0 and r["generated"] == 3 for r in rows.values())
    assert rows["full"]["vs_full"] == 1.0
