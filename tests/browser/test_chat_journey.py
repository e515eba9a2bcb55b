"""A two-turn chat on the Generate tab, like a student: turn 2 reuses exactly what turn 1 kept in the
prefix store; then a template that drops earlier answers shows where reuse stops."""

from __future__ import annotations

import re

# not the API tests' chat ("What is the capital of France?"): the server is shared, and a turn 2 another test
# already sent would find more in the store than this chat's turn 1 kept
FIRST, SECOND, THIRD = "Which city is the capital of France?", "And of Italy?", "And of Spain?"


def _turn(page, text: str, turn: int) -> str:
    page.locator("#prompt textarea").fill(text)
    page.locator("#generate-btn").click()
    diff = page.locator("#chat-diff")
    diff.get_by_text(f"Turn {turn}:", exact=False).wait_for(timeout=180_000)
    return diff.inner_text()


def test_two_turn_chat(page, screenshot):
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    num = page.get_by_label("number input for Max new tokens")
    num.fill("16")
    num.press("Enter")
    page.locator("#chat").get_by_text("Multi-turn chat", exact=False).first.click()
    page.locator("#chat-multi input").check()

    one = _turn(page, FIRST, 1)
    kept = int(re.search(r"kept this turn's first ([\d,]+) tokens", one).group(1).replace(",", ""))
    log = page.locator("#chat-log")
    log.get_by_text(FIRST).wait_for()
    assert "Paris" in log.inner_text()

    two = _turn(page, SECOND, 2)
    reused, prompt = map(int, re.search(r"Turn 2: ([\d,]+) of ([\d,]+) prompt tokens reused", two).groups())
    assert reused == kept > 0 and prompt > kept, two  # exactly the tokens turn 1 left in the store
    assert "repeats the previous turn" in two
    chart = page.locator("#chat-turns .js-plotly-plot")
    chart.wait_for(timeout=30_000)
    assert chart.locator(".barlayer .trace").count() == 2

    page.locator("#chat-template input").click()
    page.get_by_role("option", name=re.compile("drops earlier answers")).click()
    three = _turn(page, THIRD, 3)
    assert "differs from the previous turn at position" in three, three
    assert "⏎" in three  # the template's own text around the difference is shown
    assert log.get_by_text(THIRD).count() >= 1
    assert "answered nothing" not in three, three
    assert "capital" in log.inner_text().split(THIRD)[-1]  # a real answer under the third question

    assert page.locator(".toast-body.error").count() == 0, "an error toast is shown"
    assert not errors, f"JavaScript errors in the page: {errors}"
    screenshot(page, "chat_journey")
