"""A restarted server answers every show-me from the results its earlier start stored on disk.

The first server computes the show-me examples at start-up and writes them under a private results
folder (KVVIZ_RESULTS_DIR); it is stopped and a second one starts on the same folder. As soon as it
answers HTTP, a page opens at 1920×1080 in presentation mode and clicks every show-me in lecture
order (the room clicks as soon as the page is up). The seconds from the first HTTP 200 to the first
click and each click's seconds go to tests/browser/artifacts/showme_restart_times.json;
``bench/showme_speed.py --cold-restart`` judges them against the 5 s and 2 s targets. With ``KVVIZ_RESTART_NO_STORE=1`` (the bench's "before") the first server is
skipped and the second stores nothing: a fresh start as the app had before results were stored.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.browser.test_learn_journey import open_learn
from tests.browser.test_showme_walk import READY_TIMEOUT_MS, click_and_time, show_mes
from tests.server import start_app, stop_app

ARTIFACTS = Path(__file__).parent / "artifacts"
NO_STORE = os.environ.get("KVVIZ_RESTART_NO_STORE") == "1"
START_S = 600.0  # a loaded machine loads the model slowly; the clock starts at the first HTTP 200 anyway
CLICK_TIMEOUT_MS = 1_800_000 if NO_STORE else 60_000  # without a store a click waits for its computation


def fill(base: Path, results: Path, browser_context) -> None:
    """A first server that computes every example, then stops: its results stay in ``results``."""
    first = start_app(base / "first", {"KVVIZ_PRECOMPUTE": "1", "KVVIZ_RESULTS_DIR": str(results)}, timeout_s=START_S)
    try:
        page = browser_context.new_page()
        page.goto(first.url, wait_until="load")
        page.get_by_role("tab", name="Learn", exact=True).click()
        page.locator("#learn-ready").get_by_text("all", exact=False).wait_for(timeout=READY_TIMEOUT_MS)
        page.close()
    finally:
        stop_app(first.proc)


def test_a_restarted_server_answers_every_show_me_from_its_store(browser_context, tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    results = tmp_path / "results"
    if not NO_STORE:
        fill(tmp_path, results, browser_context)
        assert list(results.rglob("*.json")), "the first server stored no results"
    env = {"KVVIZ_PRECOMPUTE": "1", "KVVIZ_RESULTS_DIR": "0" if NO_STORE else str(results)}
    second = start_app(tmp_path / "second", env, timeout_s=START_S)
    answered = time.perf_counter()
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.set_viewport_size({"width": 1920, "height": 1080})
        page.set_default_timeout(60_000)
        page.goto(second.url + "?present=1", wait_until="load")
        times: dict[str, float] = {}
        first_click = None
        for button_id, sm, inner in show_mes():
            open_learn(page, inner)
            note = page.locator(f"#{button_id}-note")
            if note.count() and "not in this build yet" in note.inner_text():
                continue
            if first_click is None:
                first_click = time.perf_counter() - answered
            times[sm.label] = click_and_time(page, button_id, sm, CLICK_TIMEOUT_MS)
            report = {"store": not NO_STORE, "first_click_after_http_s": first_click, "seconds": times}
            (ARTIFACTS / "showme_restart_times.json").write_text(json.dumps(report, indent=2))  # kept as it goes
        assert len(times) >= 8
        if not NO_STORE:
            assert "read back from an earlier start" in page.locator("#learn-ready").inner_text()
            assert "show-me results read back from" in second.log()
        assert not errors, errors
    finally:
        page.close()
        stop_app(second.proc)
