"""Serving under a KV budget in a real browser, as a lecturer shows it at 1920×1080 in presentation mode: the stored
replays drawn on first sight, the budget slider redrawing every mode from them, and a live replay at a typed
budget through the gate, drawn by the same charts."""

from __future__ import annotations

import re

from kvviz.engine.budget_store import budgets, load
from kvviz.figures.kv_budget import MODE_TITLES
from tests.browser.test_learn_journey import open_tab

TRACES_JS = """(id) => { const p = document.querySelector('#' + id + ' .js-plotly-plot');
  return p && p.data ? p.data.map((t) => t.name) : null; }"""


def _note(page) -> str:
    return page.locator("#kvbudget-note").inner_text()


def test_the_budget_slider_and_a_live_replay_redraw_every_mode(browser_context, app_server, screenshot):
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.set_viewport_size({"width": 1920, "height": 1080})
        page.set_default_timeout(30_000)
        page.goto(app_server + "?tab=blocks&present=1", wait_until="load")
        open_tab(page, "#blocks-sections", "Under a KV budget")  # the section's sub-tab
        page.locator("#kvbudget-note").scroll_into_view_if_needed()
        assert _note(page).startswith("At 720.0 MiB of KV:")  # the stored replays, drawn before any click
        page.wait_for_function(f"({TRACES_JS})('kvbudget-running') !== null")
        drawn = page.evaluate(TRACES_JS, "kvbudget-running")
        assert drawn == list(MODE_TITLES.values()), drawn  # at 720 MiB every mode holds a sequence

        box = page.locator("#kvbudget-budget input[type=number]")
        box.fill("0")  # the smallest stored budget: fewer sequences fit, every mode redrawn
        box.press("Enter")
        smallest = budgets(load(), "room")[0] / 2**20  # the stored file's smallest budget
        page.locator("#kvbudget-note").get_by_text(re.compile(rf"^At {smallest:.1f} MiB of KV:")).wait_for()
        page.wait_for_function(f"!({TRACES_JS})('kvbudget-running').includes({MODE_TITLES['contiguous-context']!r})")
        small = page.evaluate(TRACES_JS, "kvbudget-running")
        assert small == [t for m, t in MODE_TITLES.items() if m != "contiguous-context"], small
        assert page.locator("#kvbudget-table").get_by_text("paged", exact=True).count() == 1
        assert "none (one sequence's reservation is larger than the budget)" in _note(page)

        live = page.locator("#kvbudget-live-mib input[type=number]")
        live.fill("6")
        page.locator("#kvbudget-live-n input[type=number]").fill("1")
        page.locator("#kvbudget-live").click()
        page.locator("#kvbudget-note").get_by_text(re.compile(r"^Replayed live now \(1 student")).wait_for(
            timeout=180_000
        )
        assert "At 6.0 MiB of KV:" in _note(page)
        rows = page.locator("#kvbudget-table").inner_text()
        assert all(title in rows for title in MODE_TITLES.values()), rows
        screenshot(page, "kv_budget_live")
        assert not errors, errors
    finally:
        page.close()
