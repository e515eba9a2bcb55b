"""Every show-me lands its view once the start-up examples are ready: the tab, the result, the outline, in sight.

The session's ``examples_server`` computed the examples at start-up (KVVIZ_PRECOMPUTE=1); the test checks the
Learn tab's readiness line, then, at 1920×1080 in presentation mode, clicks each show-me in lecture
order and waits until the view shows its result, outlined and in the viewport. The time of each
click is written with a screenshot per show-me under tests/browser/artifacts/; whether they meet the
2 s target is judged by ``bench/showme_speed.py`` (a speed target is a benchmark's, not a test's).

In the suite the walk clicks the newest views and the live architectures (:data:`SAMPLE`): every show-me is
clicked, with its own numbers checked from the store, by ``test_showme_restart.py`` on a server started on this
one's results, so clicking them all here as well only doubled two minutes of the suite. The bench sets
``KVVIZ_SHOWME_ALL=1`` and the walk clicks every one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvviz.lessons.objectives import CAUSAL_DECODE, FORGET_APPEND
from kvviz.lessons.showme import CHAT_REUSE, DISK_TIER, KV_BUDGET, KVZIP_SNAPKV, LIVE_GQA
from tests.browser.showme import READY_TIMEOUT_MS, click_and_time, look_for_numbers, numbers_on_screen, show_mes
from tests.browser.test_learn_journey import open_learn, selected_tabs

ARTIFACTS = Path(__file__).parent / "artifacts"
NEWEST = (CAUSAL_DECODE, FORGET_APPEND, CHAT_REUSE, DISK_TIER, KV_BUDGET, KVZIP_SNAPKV, LIVE_GQA)
LIVE = {"Qwen3-Next's linear-attention state, live", "Gemma-4's cross-layer KV sharing, live"}
ALL = os.environ.get("KVVIZ_SHOWME_ALL") == "1"  # bench/showme_speed.py: every show-me, timed
# the show-mes the suite's walk clicks (the restart test clicks every one)
SAMPLE = {sm.label for sm in NEWEST} | LIVE


def test_every_show_me_lands_its_view_in_presentation_mode(browser_context, examples_server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.set_viewport_size({"width": 1920, "height": 1080})
        page.set_default_timeout(60_000)
        page.goto(examples_server.url + "?present=1", wait_until="load")
        page.locator("#learn-tabs").wait_for()  # presentation mode opens on the Learn tab
        assert [t.strip() for t in selected_tabs(page)][0] == "Learn"
        page.locator("#learn-ready").get_by_text("all", exact=False).wait_for(timeout=READY_TIMEOUT_MS)
        assert page.evaluate("document.body.classList.contains('kvviz-present')")

        times: dict[str, float] = {}
        for button_id, sm, inner in show_mes():
            if not ALL and sm.label not in SAMPLE:
                continue
            open_learn(page, inner)
            note = page.locator(f"#{button_id}-note").inner_text() if page.locator(f"#{button_id}-note").count() else ""
            if "not in this build yet" in note:
                continue
            look = page.locator(f"#{button_id}-note")  # the point of the view, readable by the room
            assert look.is_visible() and "Look for" in look.inner_text(), button_id
            numbers = look_for_numbers(page, button_id, sm)
            try:
                times[sm.label] = click_and_time(page, button_id, sm)
                numbers_on_screen(page, sm, numbers)  # the line's numbers, computed from the result, in the view
            except Exception as exc:
                page.screenshot(path=str(ARTIFACTS / f"{button_id}-failed.png"))
                raise AssertionError(f"show-me {sm.label!r} ({button_id}) did not land its view: {exc}") from exc
            page.screenshot(path=str(ARTIFACTS / f"{button_id}.png"))
        (ARTIFACTS / "showme_times.json").write_text(json.dumps(times, indent=2))
        print("\nshow-me times (s):")
        for label, seconds in times.items():
            print(f"  {seconds:5.2f}  {label}")
        assert len(times) >= (20 if ALL else len(SAMPLE))
        assert set(times) >= LIVE
        # the newest views, each reached from Learn with its "Look for" numbers found on screen
        assert {sm.label for sm in NEWEST} <= set(times), sorted(times)
        assert page.locator(".toast-body.error").count() == 0, page.locator(".toast-body.error").all_inner_texts()
        assert not errors, errors
    finally:
        page.close()
