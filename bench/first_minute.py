"""A visitor's first minute: seconds from each tab's first click to its first chart drawn, in a real browser.

Run: ``.venv/bin/python bench/first_minute.py`` (needs Chromium: ``KVVIZ_CHROMIUM`` or ``/usr/bin/chromium``).
It runs the browser test ``tests/browser/test_first_minute.py``: a first server computes and stores the show-me
examples, a second starts on that store, and a fresh 1920×1080 page clicks every tab once (a fresh server), then a
second fresh page does it again (a warm server). Each time counts from the moment the tab's button is on screen
on a page whose first screen is drawn (a visitor reads the stored chat example before picking a tab); the page's
own opening is reported apart (``tab_bar_s``: from asking for the page to its tab bar; ``first_screen_s``: to its
first screen's charts). A tab's seconds are the page's own, from the click on its button to its first chart drawn
(checked every frame); the test driver's time from its click call (which adds its own checks and round trips) is
reported beside them. Writes ``bench/results/first_minute.json`` with the seconds per tab
for both pages against the 1.5 s target.

``--no-store`` skips the first server: the second computes its examples at start-up and each tab waits for its own
(no target applies; writes ``bench/results/first_minute_no_store.json``). ``--tabs Leaderboard,Learn`` clicks only
those tabs (a smoke check: ``--no-store --tabs Leaderboard`` takes a minute). ``--results <folder>`` keeps the stored
examples there: filled on the first run, reused by the next (while the code is unchanged).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES = ROOT / "tests" / "browser" / "artifacts" / "first_minute_times.json"
RESULTS = ROOT / "bench" / "results"
TARGET_S = 1.5


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--no-store", action="store_true", help="no stored examples: each tab waits for its own")
    p.add_argument("--tabs", default="", help="comma-separated tab titles to click (default: every tab)")
    p.add_argument("--results", default="", help="where to keep the stored examples (reused when filled)")
    args = p.parse_args(argv)
    env = {**os.environ, "KVVIZ_FIRST_MINUTE_NO_STORE": "1" if args.no_store else "0"}
    if args.tabs:
        env["KVVIZ_FIRST_MINUTE_TABS"] = args.tabs
    if args.results:
        env["KVVIZ_FIRST_MINUTE_RESULTS"] = args.results
    TIMES.unlink(missing_ok=True)
    test = "tests/browser/test_first_minute.py"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", test], cwd=ROOT, env=env)
    if not TIMES.exists():
        print("the test recorded no times")
        return 1
    found = json.loads(TIMES.read_text())
    # the test's own bound (``target_s`` there: what fails it) is not the product's target
    report = {**found, "test_bound_s": found.pop("target_s", None), "target_s": TARGET_S}
    report["test_passed"] = done.returncode == 0
    for page in ("fresh_server", "warm_server"):
        driver = (found.get("driver_s") or {}).get(page) or {}
        for tab, seconds in (found.get(page) or {}).items():
            shown = "no chart" if seconds is None else f"{seconds:.2f} s"
            if driver.get(tab) is not None:
                shown += f" (test driver's call to drawn: {driver[tab]:.2f} s)"
            late = " (over the target)" if seconds is not None and seconds > TARGET_S and not args.no_store else ""
            print(f"{page:>12}  {tab:<18} {shown}{late}")
        for what, label in (("tab_bar_s", "(tab bar drawn)"), ("first_screen_s", "(first screen)")):
            seconds = (found.get(what) or {}).get(page)
            if seconds is not None:
                print(f"{page:>12}  {label:<18} {seconds:.2f} s after the page was asked for")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("first_minute_no_store.json" if args.no_store else "first_minute.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
