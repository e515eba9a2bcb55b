"""The first screen teaches at once: a server started on a stored example set opens on the Generate tab with
the stored chat example's token stream, cache growth and memory gauge drawn, one line saying what it is and
how to try your own, and the form set to it; the Memory tab opens drawn too.

A first server computes the opening example at start-up into a private results folder (KVVIZ_RESULTS_DIR)
while a page shows its progress, and stops once the page shows the example; a second starts on that folder
with start-up computing off (nothing else loads the machine). Its page must show Generate's charts within
:data:`FIRST_CHART_S` of the page's load event, and Memory's within :data:`FIRST_CHART_S` of the tab's
click. Each measured time goes to tests/browser/artifacts/first_screen_times.json.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.browser.showme import IN_VIEW
from tests.server import start_app, stop_app

ARTIFACTS = Path(__file__).parent / "artifacts"
START_S = 600.0
# drawn from the store, not computed on the click (a computation takes tens of seconds); how fast is the bench's
# to measure (bench/first_minute.py, target 1.5 s), not a timed test's
FIRST_CHART_S = float(os.environ.get("KVVIZ_FIRST_CHART_S", "15"))
COMPUTE_MS = 1_800_000  # the opening example on a busy 2-core machine (well under a minute when quiet)
# an element that is on screen, drawn, and not an empty frame (IN_VIEW, less the viewport: the gauge sits below)
DRAWN = (
    "id => { const e = document.getElementById(id); if (!e || !e.getClientRects().length) return false;"
    " if (e.querySelector('[aria-label=\"Empty value\"]')) return false;"
    " const p = e.querySelector('.js-plotly-plot'); return !p || !!p.querySelector('.main-svg'); }"
)
GENERATE_VIEWS = ("cache-growth", "memory-gauge")
MEMORY_VIEWS = ("memory-size", "memory-capacity", "memory-decode", "memory-gauge-budget")


def chips(page) -> int:
    return page.locator("#token-stream .token-container").count()


def wait_drawn(page, ids: tuple[str, ...], timeout_ms: int) -> float:
    """Seconds until every element of ``ids`` is drawn (polled)."""
    t0 = time.perf_counter()
    js = "ids => ids.every(id => (" + DRAWN + ")(id))"
    page.wait_for_function(js, arg=list(ids), timeout=timeout_ms, polling=50)
    return time.perf_counter() - t0


def fill(base: Path, results: Path, browser_context) -> None:
    """A first server that computes the opening example at start-up, its page saying how far it got."""
    first = start_app(base / "first", {"KVVIZ_PRECOMPUTE": "1", "KVVIZ_RESULTS_DIR": str(results)}, timeout_s=START_S)
    try:
        page = browser_context.new_page()
        page.goto(first.url, wait_until="load")
        status = page.locator("#gen-status")
        status.get_by_text("Example", exact=False).wait_for(timeout=120_000)  # says what it is, never empty
        deadline = time.monotonic() + COMPUTE_MS / 1000
        while "stored:" not in status.inner_text():  # progress while it runs; a page opened later finds it
            assert time.monotonic() < deadline, status.inner_text()
            if "press Generate to run it" in status.inner_text():
                time.sleep(2)
                page.reload(wait_until="load")
                status.get_by_text("Example", exact=False).wait_for(timeout=120_000)
            else:
                time.sleep(0.5)
        page.close()
    finally:
        stop_app(first.proc)


def test_the_first_screen_and_the_memory_tab_open_drawn_from_the_stored_examples(browser_context, tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    results = tmp_path / "results"
    fill(tmp_path, results, browser_context)
    assert list(results.rglob("*.json")), "the first server stored no results"
    second = start_app(
        tmp_path / "second", {"KVVIZ_PRECOMPUTE": "0", "KVVIZ_RESULTS_DIR": str(results)}, timeout_s=START_S
    )
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.set_viewport_size({"width": 1920, "height": 1080})
        page.goto(second.url, wait_until="load")
        times = {"generate": wait_drawn(page, GENERATE_VIEWS, 60_000)}
        status = page.locator("#gen-status").inner_text()
        n_chips, answer = chips(page), page.locator("#answer textarea").input_value()
        max_new = page.locator("#gen-max-new input[type=number]").input_value()
        growth_on_screen = page.evaluate(IN_VIEW, "cache-growth")
        page.get_by_role("tab", name="Memory").click()
        times["memory"] = wait_drawn(page, MEMORY_VIEWS, 60_000)
        (ARTIFACTS / "first_screen_times.json").write_text(json.dumps(times, indent=2))
        assert "Example “Chat question” (24 new tokens, greedy), stored" in status, status
        assert "press Generate to try your own" in status and "read from disk" in status, status
        assert n_chips > 24 and answer.strip(), (n_chips, answer)
        assert max_new == "24"  # the form says what the page shows
        assert growth_on_screen, "the cache growth chart is not on the first screen"
        assert "320 KiB" in page.locator("#memory-summary").inner_text()
        assert times["generate"] <= FIRST_CHART_S and times["memory"] <= FIRST_CHART_S, times
        assert page.locator(".toast-body.error").count() == 0, page.locator(".toast-body.error").all_inner_texts()
        assert not errors, errors
    finally:
        page.close()
        stop_app(second.proc)
