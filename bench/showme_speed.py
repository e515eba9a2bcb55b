"""How long each Learn show-me takes to land its view in a real browser, against the 2 s target.

Run: ``.venv/bin/python bench/showme_speed.py`` (needs Chromium: ``KVVIZ_CHROMIUM`` or Playwright's).
It runs the browser walk ``tests/browser/test_showme_walk.py`` — a server of its own computes the
examples at start-up, then every show-me is clicked at 1920×1080 in presentation mode — and reads the
seconds it recorded per show-me. Writes ``bench/results/showme_speed.json``.

``--cold-restart`` runs ``tests/browser/test_showme_restart.py`` instead: a first server computes and
stores the examples, a second starts on its store and every show-me is clicked from 5 s after its first
HTTP 200 (a Space waking up). Writes ``bench/results/showme_restart.json``; with ``--no-store`` the first
server is skipped and nothing is stored (a fresh start as before stored results:
``bench/results/showme_restart_before.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "browser" / "artifacts"
TARGET_S = 2.0
FIRST_CLICK_S = 5.0  # --cold-restart: every show-me is clicked from this soon after the first HTTP 200


def walk(test: str, times_file: Path, env: dict[str, str]) -> tuple[bool, dict | None]:
    """Run one browser test; (passed, what it recorded)."""
    times_file.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", test], cwd=ROOT, env=env)
    return done.returncode == 0, (json.loads(times_file.read_text()) if times_file.exists() else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cold-restart", action="store_true", help="a restarted server, every show-me clicked at once")
    p.add_argument("--no-store", action="store_true", help="with --cold-restart: no stored results (before)")
    args = p.parse_args(argv)
    env = dict(os.environ)
    extra: dict = {}
    if args.cold_restart:
        env["KVVIZ_RESTART_NO_STORE"] = "1" if args.no_store else "0"
        passed, found = walk("tests/browser/test_showme_restart.py", ARTIFACTS / "showme_restart_times.json", env)
        times = (found or {}).get("seconds", {})
        extra = {k: v for k, v in (found or {}).items() if k != "seconds"}
        name = "showme_restart_before.json" if args.no_store else "showme_restart.json"
    else:
        env["KVVIZ_SHOWME_ALL"] = "1"  # the suite's walk clicks a sample; the bench times every show-me
        passed, found = walk("tests/browser/test_showme_walk.py", ARTIFACTS / "showme_times.json", env)
        times, name = found or {}, "showme_speed.json"
    if not times:
        print("the walk recorded no times")
        return 1
    slow = {k: v for k, v in times.items() if v > TARGET_S}
    report = {
        "target_s": TARGET_S,
        **extra,
        "walk_passed": passed,
        "load_average": os.getloadavg(),
        "seconds": times,
        "within_target": len(times) - len(slow),
        "slower": slow,
    }
    (ROOT / "bench" / "results" / name).write_text(json.dumps(report, indent=2) + "\n")
    for label, seconds in times.items():
        print(f"{seconds:5.2f} s  {'ok ' if seconds <= TARGET_S else 'SLOW'}  {label}")
    print(f"{report['within_target']} of {len(times)} within {TARGET_S:g} s")
    late = args.cold_restart and (extra.get("first_click_after_http_s") or 0) > FIRST_CLICK_S
    if args.cold_restart:
        print(
            f"first click {extra.get('first_click_after_http_s', 0):.1f} s after the first HTTP 200 (target {FIRST_CLICK_S:g} s)"
        )
    return 0 if passed and not slow and not late else 1


if __name__ == "__main__":
    sys.exit(main())
