"""bench/results holds the runs the README and docs cite, and every result they cite is there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CITING = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench").glob("*.py"))]


def _cited() -> set[str]:
    text = "\n".join(p.read_text(encoding="utf-8") for p in CITING)
    return set(re.findall(r"[A-Za-z0-9_]+\.json", text))


def test_every_stored_result_is_cited():
    stored = {p.name for p in RESULTS.glob("*.json")}
    assert stored and stored <= _cited(), sorted(stored - _cited())


def test_every_cited_load_run_is_stored():
    cited = {name for name in _cited() if name.startswith(("load_", "page_speed"))}
    missing = sorted(name for name in cited if not (RESULTS / name).exists())
    assert cited and not missing, missing
