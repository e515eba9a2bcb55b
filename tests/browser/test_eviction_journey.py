"""The Eviction journey in a real browser: pick StreamingLLM, set a budget, run, scrub a step, compare with the full cache."""

from __future__ import annotations

import re

CONTEXT = (
    "The museum opens at nine. The code for the staff room is 5512. Visitors enjoy the garden, the cafe "
    "and the old paintings in the east gallery."
)
QUESTION = "Question: What is the code for the staff room?"


def _number(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(value)
    box.press("Enter")


def test_eviction_journey(page, screenshot):
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.get_by_role("tab", name="Eviction").click()

    page.locator("#evict-prompt textarea").fill(CONTEXT)
    page.locator("#evict-question textarea").fill(QUESTION)
    page.locator("#evict-policy input").click()
    page.get_by_role("option", name="StreamingLLM (sinks + recent)").click()
    _number(page, "evict-budget", "24")
    _number(page, "evict-max-new", "4")
    page.locator("#evict-run").click()

    status = page.locator("#evict-status")
    status.get_by_text(re.compile(r"n_kept = 24")).wait_for(timeout=120_000)
    assert "original RoPE positions" in status.inner_text()
    strip = page.locator("#evict-strip")
    strip.get_by_text("evicted").first.wait_for(timeout=30_000)
    assert strip.get_by_text("sink").count() >= 1
    page.locator("#evict-map .js-plotly-plot").wait_for(timeout=30_000)
    page.locator("#evict-timeline .js-plotly-plot").wait_for(timeout=30_000)
    assert page.locator("#evict-slots").get_by_text("original position").count() >= 1

    # scrub to a later decode step: the slot table still holds the budget, the newest token joins the window
    _number(page, "evict-step", "2")
    page.wait_for_timeout(1500)
    assert page.locator("#evict-answer textarea").input_value().strip()

    # side by side with the full cache, StreamingLLM only
    for name in ("H2O (heavy hitters + recent)", "SnapKV (observation-window votes)"):
        page.locator("#evict-compare-policies").get_by_label(name).uncheck()
    page.locator("#evict-compare").click()
    table = page.locator("#evict-table")
    table.get_by_text("Full cache (no eviction)").wait_for(timeout=180_000)
    assert table.get_by_text("StreamingLLM (sinks + recent)").count() >= 1
    page.locator("#evict-bytes .js-plotly-plot").wait_for(timeout=30_000)

    assert page.locator(".toast-body.error").count() == 0, "an error toast is shown"
    assert not errors, f"JavaScript errors in the page: {errors}"
    screenshot(page, "eviction_journey")


def test_eviction_bad_budget_is_a_message(page):
    page.get_by_role("tab", name="Eviction").click()
    page.locator("#evict-policy input").click()
    page.get_by_role("option", name="SnapKV (observation-window votes)").click()
    _number(page, "evict-budget", "8")
    page.locator("#evict-run").click()
    page.locator(".toast-body.error").get_by_text(re.compile("observation window")).wait_for(timeout=30_000)
