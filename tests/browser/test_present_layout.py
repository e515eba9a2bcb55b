"""In front of a room (1920 × 1080, ``?present=1``): the point of each view is on the first screen and fits it;
one message at a time.

Measured from the page's own boxes: the streamed tokens while generating, every column of the
Quantization table, the error chart's legend against its bars, each chart title against its chart.
"""

from __future__ import annotations

import re

from tests.browser.form import set_form

W, H = 1920, 1080
LONG = 180_000
# each visible chart's title box against the chart's box (a title running off the edge is cut)
TITLES_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].filter((p) => p.offsetParent !== null)
  .map((p) => { const t = p.querySelector('.gtitle'); if (!t) return null;
    const a = p.getBoundingClientRect(), b = t.getBoundingClientRect();
    return [p.closest('.block') && p.closest('.block').id, t.textContent, b.left >= a.left - 1 && b.right <= a.right + 1]; })
  .filter((x) => x)"""
TOASTS_JS = """() => [...document.querySelectorAll('.toast-wrap [data-testid=toast-text]')]
  .filter((t) => t.offsetParent !== null && t.getBoundingClientRect().height > 0).map((t) => t.textContent.trim())"""


def open_page(browser_context, url: str, width: int = W, height: int = H):
    tab = browser_context.new_page()
    tab.set_default_timeout(30_000)
    tab.set_viewport_size({"width": width, "height": height})
    tab.goto(url, wait_until="load")
    tab.wait_for_selector("#generate-btn", state="attached")
    return tab


def on_screen(tab, selector: str) -> bool:
    return tab.evaluate(
        """(sel) => { const e = [...document.querySelectorAll(sel)].pop(); if (!e) return false; const r = e.getBoundingClientRect();
           return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight; }""",
        selector,
    )


def test_generating_while_presenting_shows_the_new_tokens_on_the_first_screen(browser_context, app_server):
    tab = open_page(browser_context, app_server + "?tab=generate&present=1")
    try:
        set_form(tab, "Once upon a time", 40)
        n_prompt = 4
        tab.locator("#generate-btn").click()
        # while the run streams (the page opened on the stored example's tokens: wait for this run's status),
        # the status line and the newest token are in the window the room sees
        tab.wait_for_function(
            f"""() => /^(Generating|Done)/.test(document.querySelector('#gen-status')?.innerText)
                && document.querySelectorAll('#token-stream .token-container').length > {n_prompt + 2}""",
            timeout=LONG,
        )
        tab.wait_for_function(
            """() => { const s = document.querySelector('#gen-status').getBoundingClientRect();
               return s.top >= 0 && s.bottom <= innerHeight; }"""
        )
        assert on_screen(tab, "#token-stream .token-container")
        tab.locator("#gen-status").get_by_text(re.compile(r"^Done")).wait_for(timeout=LONG)
        last = "#token-stream .token-container"
        assert tab.locator("#token-stream .token-container").count() > n_prompt + 10
        assert on_screen(tab, last), tab.evaluate(
            f"[...document.querySelectorAll('{last}')].pop().getBoundingClientRect().bottom"
        )
        tab.screenshot(path="/tmp/present_generate.png")
    finally:
        tab.close()


def test_the_quantization_view_fits_a_presentation_screen(browser_context, app_server):
    tab = open_page(browser_context, app_server + "?tab=quant&present=1")
    try:
        tab.locator("#quant-analyze").click()
        tab.locator("#quant-errors .gtitle").wait_for(timeout=LONG)
        tab.locator("#quant-table").get_by_text("K error (%)", exact=False).first.wait_for()
        # every column of the table on the screen, the errors right after the scheme's name
        heads = tab.evaluate(
            """[...document.querySelectorAll('#quant-table thead th')].filter((t) => t.offsetParent !== null)
               .map((t) => [t.textContent.trim(), t.getBoundingClientRect().right])"""
        )
        assert len(heads) == 9, heads
        assert all(right <= W + 1 for _, right in heads), heads
        assert "error" in heads[1][0] and "error" in heads[3][0], heads
        # the legend beside the bars, not over them
        boxes = tab.evaluate(
            """() => { const p = document.querySelector('#quant-errors');
               const a = p.querySelector('.legend').getBoundingClientRect(), b = p.querySelector('.nsewdrag').getBoundingClientRect();
               return [a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom, a.toJSON(), b.toJSON()]; }"""
        )
        assert not boxes[0], boxes
        titles = tab.evaluate(TITLES_JS)
        assert len(titles) >= 6, titles
        assert all(inside for _, _, inside in titles), [t for t in titles if not t[2]]
        keys = next(text for elem, text, _ in titles if elem == "quant-keys")
        assert re.search(r"outlier ratio [\d.]+× \(largest channels [\d, ]+\)$", keys), keys  # wrapped, not cut
        tab.locator("#quant-table").scroll_into_view_if_needed()
        tab.screenshot(path="/tmp/present_quant.png")
        tab.screenshot(path="/tmp/present_quant_full.png", full_page=True)
    finally:
        tab.close()


def test_a_new_message_replaces_the_earlier_ones(browser_context, app_server):
    tab = open_page(browser_context, app_server, 1400, 1000)
    try:
        tab.locator("#prompt textarea").fill("")
        tab.locator("#generate-btn").click()
        tab.get_by_text("The prompt is empty: type some text or pick an example.").wait_for()
        # a second bad input, on another tab: its message alone, the first one gone
        tab.get_by_role("tab", name="Quantization", exact=True).click()
        # the tab's first open draws its example (setting the prompt): type once it has, or the example wins
        tab.locator("#quant-example").get_by_text("example", exact=False).wait_for()
        tab.locator("#quant-prompt textarea").fill("  ")
        tab.locator("#quant-analyze").click()
        tab.get_by_text(re.compile("^The prompt is empty: type some text \\(a few")).wait_for()
        tab.wait_for_timeout(300)
        assert tab.evaluate(TOASTS_JS) == [tab.evaluate(TOASTS_JS)[0]] and "a few" in tab.evaluate(TOASTS_JS)[0]
        assert tab.locator(".toast-wrap .toast-count:visible").count() == 0  # never "Error (2)"
        # a message of another kind that arrives with no click in between (a script's click) replaces it too
        tab.get_by_role("tab", name="Attention", exact=True).click()
        tab.locator("#attn-example").get_by_text("example", exact=False).wait_for()
        box = tab.locator("#attn-layer input[type=number]")
        box.fill("99")  # typing sends the value: its message comes before the Enter that commits it
        tab.get_by_text("Layer must be between 0 and 29; got 99.").wait_for()
        box.press("Enter")  # the box's own change event, after its message: the message stays
        tab.wait_for_timeout(300)
        assert tab.evaluate(TOASTS_JS) == ["Layer must be between 0 and 29; got 99."]
        tab.evaluate("document.querySelector('#generate-btn').click()")  # the empty prompt again, untrusted click
        tab.wait_for_function(f"({TOASTS_JS})().some((t) => t.startsWith('The prompt is empty: type some text or'))")
        tab.wait_for_timeout(300)
        shown = tab.evaluate(TOASTS_JS)
        assert shown == ["The prompt is empty: type some text or pick an example."], shown
        assert tab.locator(".toast-wrap .toast-body:visible").count() == 1
    finally:
        tab.close()
