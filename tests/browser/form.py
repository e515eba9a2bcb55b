"""The Generate tab's form as a test fills it: a raw prompt (no chat template) and a number of new tokens."""

from __future__ import annotations

import re


def set_form(tab, prompt: str, n_new: int) -> None:
    """Type ``prompt``, turn the chat template off and set Max new tokens to ``n_new`` (committed with Enter)."""
    tab.locator("#prompt textarea").fill(prompt)
    tab.get_by_label("Use the chat template").uncheck()
    box = tab.get_by_label("number input for Max new tokens")
    box.fill(str(n_new))
    box.press("Enter")


def generate(tab, prompt: str, n_new: int, timeout_ms: float) -> None:
    """:func:`set_form`, press Generate and wait until the status line says Done."""
    set_form(tab, prompt, n_new)
    tab.locator("#generate-btn").click()
    tab.locator("#gen-status").get_by_text(re.compile(r"^Done")).wait_for(timeout=timeout_ms)
