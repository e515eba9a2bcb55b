"""The Blocks tab's live prefix cache in a real browser: one student watches it while another generates."""

from __future__ import annotations

import json
import re

from kvviz.engine.prefix import BLOCK_SIZE

QUESTION = "Zebra zebra zebra zebra zebra zebra zebra zebra zebra zebra zebra zebra: what does the prefix cache keep?"


def _text(page, elem_id: str, pattern: str, timeout_ms: int = 30_000) -> None:
    """Wait until the element's text matches (a Dataframe's cells are not all "visible" to Playwright)."""
    page.wait_for_function(
        "([id, pat]) => new RegExp(pat, 'i').test(document.getElementById(id)?.textContent ?? '')",
        arg=[elem_id, pattern],
        timeout=timeout_ms,
    )


def _fn_index(request) -> int:
    return json.loads(request.post_data or "{}").get("fn_index", -1)


def test_the_room_section_lists_blocks_live(page, browser_context, app_server, screenshot):
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.get_by_role("tab", name="Blocks").click()
    page.get_by_role("tab", name="The room's cache").click()  # the section's sub-tab
    room = page.locator("#room-summary")
    room.get_by_text(re.compile(r"Hit rate \d+%")).wait_for(timeout=30_000)

    # another student generates; the first one's open tab refreshes by itself
    other = browser_context.new_page()
    try:
        other.goto(app_server, wait_until="load")
        other.locator("#prompt textarea").fill(QUESTION)
        num = other.get_by_label("number input for Max new tokens")
        num.fill("3")
        num.press("Enter")
        other.locator("#generate-btn").click()
        other.locator("#gen-status").get_by_text(re.compile(r"^Done")).wait_for(timeout=180_000)
    finally:
        other.close()

    _text(page, "room-table", "zebra")  # refreshed by the timer: this page did nothing
    _text(page, "room-table", r"im_start\|>system")  # the chat template's first block
    _text(page, "room-summary", r"capacity; 0 held by running requests")  # the run is over: released
    room.get_by_text(re.compile(rf"[1-9][\d,]* blocks? of {BLOCK_SIZE} tokens cached")).wait_for(timeout=10_000)
    assert re.search(r"Hit rate \d+%", room.inner_text())
    assert page.locator("#room-tree .gtitle").get_by_text(re.compile(r"cached blocks? from")).count() == 1

    assert page.locator(".toast-body.error").count() == 0, "an error toast is shown"
    assert not errors, f"JavaScript errors in the page: {errors}"
    screenshot(page, "blocks_room")

    # it polls while shown, and stops once the student moves to another tab
    calls: list[int] = []
    page.on("request", lambda r: calls.append(_fn_index(r)) if r.url.endswith("/run/predict") else None)
    page.wait_for_timeout(4_500)
    polled = set(calls)
    assert polled, "the open section refreshes itself"
    page.get_by_role("tab", name="Generate").click()
    page.wait_for_timeout(1_000)  # a tick already sent may still land
    seen = len(calls)
    page.wait_for_timeout(4_500)
    assert not polled & set(calls[seen:]), "a hidden section kept polling"
