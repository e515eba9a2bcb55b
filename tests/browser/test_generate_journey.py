"""The main journey in a real browser: type a prompt, press Generate, watch tokens and the cache chart appear."""

from __future__ import annotations

import re

PROMPT = "What is the capital of France?"


def test_generate_journey(page, screenshot):
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    box = page.locator("#prompt textarea")
    box.fill(PROMPT)
    # fewer tokens keep the journey quick; the slider's number box accepts typing
    num = page.get_by_label("number input for Max new tokens")
    num.fill("12")
    num.press("Enter")
    page.locator("#generate-btn").click()

    # the stream shows prompt tokens (the prompt's own words) and generated ones, ending in "Paris"
    stream = page.locator("#token-stream")
    stream.get_by_text("capital", exact=False).first.wait_for(timeout=90_000)
    status = page.locator("#gen-status")
    status.get_by_text(re.compile(r"^Done")).wait_for(timeout=120_000)
    assert "Paris" in page.locator("#answer textarea").input_value()

    chart = page.locator("#cache-growth .js-plotly-plot")
    chart.wait_for(timeout=30_000)
    assert chart.locator(".scatterlayer .trace").count() >= 1, "the cache-growth chart has no line"
    assert page.locator("#equivalence").inner_text().strip(), "the equivalence result is missing"

    assert page.locator(".toast-body.error").count() == 0, "an error toast is shown"
    assert not errors, f"JavaScript errors in the page: {errors}"
    screenshot(page, "generate_journey")
