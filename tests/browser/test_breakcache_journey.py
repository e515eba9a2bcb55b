"""Break the cache in front of a room (1920 × 1080, ``?present=1``): two faults and the all-clear run, each
with its map's first divergence named in the chart's title, the verdict and the tokens beside the correct run's."""

from __future__ import annotations

import re

W, H = 1920, 1080
LONG = 240_000


def _choose(page, label: str) -> None:
    page.locator("#breakcache-fault input").click()
    page.get_by_role("option", name=label).click()


def _run(page, title: re.Pattern) -> str:
    page.locator("#breakcache-run").click()
    page.locator("#breakcache-map .gtitle").get_by_text(title).wait_for(timeout=LONG)
    page.locator("#breakcache-tokens").get_by_text("correct run").first.wait_for(timeout=30_000)
    return page.locator("#breakcache-verdict").inner_text()


def test_break_the_cache_two_faults_and_the_all_clear(browser_context, app_server, screenshot):
    page = browser_context.new_page()
    page.set_default_timeout(30_000)
    page.set_viewport_size({"width": W, "height": H})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(app_server + "?tab=breakcache&present=1", wait_until="load")
        page.locator("#breakcache-run").wait_for()
        assert page.evaluate("document.body.classList.contains('kvviz-present')")

        _choose(page, "decode with a causal mask")  # step 2, layer 0: the defaults
        text = _run(page, re.compile(r"First divergence: step 2, layer 0, position \d+ \(attention output\)"))
        assert "Decode with a causal mask." in text and "causal=False" in text, text
        screenshot(page, "breakcache_causal")

        _choose(page, "forget to append")
        text = _run(page, re.compile(r"First divergence: step 2, layer 0, position \d+ \(cache length\)"))
        assert "Forget to append." in text and "append, then attend" in text, text
        screenshot(page, "breakcache_not_appended")

        _choose(page, "none — the correct cache (all clear)")
        text = _run(page, re.compile(r"^All clear"))
        assert text.startswith("All clear. No divergence"), text
        assert page.locator("#breakcache-tokens").get_by_text("no", exact=True).count() == 0
        screenshot(page, "breakcache_all_clear")

        assert page.locator(".toast-body.error").count() == 0, "an error toast is shown"
        assert not errors, f"JavaScript errors in the page: {errors}"
    finally:
        page.close()
