"""How long each Learn show-me takes to land its view in a real browser, against the 2 s target.

Run: ``.venv/bin/python bench/showme_speed.py`` (needs Chromium: ``KVVIZ_CHROMIUM`` or Playwright's).
It runs the browser walk ``tests/browser/test_showme_walk.py`` — a server of its own computes the
examples at start-up, then every show-me is clicked at 1920×1080 in presentation mode — and reads the
seconds it recorded per show-me. Writes ``bench/results/showme_speed.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES = ROOT / "tests" / "browser" / "artifacts" / "showme_times.json"
TARGET_S = 2.0


def main() -> int:
    TIMES.unlink(missing_ok=True)
    walk = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/browser/test_showme_walk.py"], cwd=ROOT, env=os.environ
    )
    if not TIMES.exists():
        print("the walk recorded no times")
        return 1
    times = json.loads(TIMES.read_text())
    slow = {k: v for k, v in times.items() if v > TARGET_S}
    report = {
        "target_s": TARGET_S,
        "walk_passed": walk.returncode == 0,
        "load_average": os.getloadavg(),
        "seconds": times,
        "within_target": len(times) - len(slow),
        "slower": slow,
    }
    (ROOT / "bench" / "results" / "showme_speed.json").write_text(json.dumps(report, indent=2) + "\n")
    for label, seconds in times.items():
        print(f"{seconds:5.2f} s  {'ok ' if seconds <= TARGET_S else 'SLOW'}  {label}")
    print(f"{report['within_target']} of {len(times)} within {TARGET_S:g} s")
    return 0 if walk.returncode == 0 and not slow else 1


if __name__ == "__main__":
    sys.exit(main())
