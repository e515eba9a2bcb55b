"""A student on a phone (390 × 844): every tab is reachable, tables scroll, nothing wraps letter by letter."""

from __future__ import annotations

TABS = ["Generate", "Attention", "Eviction", "Memory", "Quantization", "Cache vs no cache", "Blocks", "Learn"]
WIDTH = 390


def _visible_tab_buttons(page) -> list[str]:
    """Tab buttons a user can see and tap without opening a menu."""
    return page.evaluate("""() => [...document.querySelectorAll('.tab-wrapper button')]
        .filter((b) => { const r = b.getBoundingClientRect(), s = getComputedStyle(b);
                         return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && r.right <= innerWidth + 1
                                && b.closest('.visually-hidden') === null; })
        .map((b) => b.textContent.trim())""")


def test_phone_layout(browser_context, app_server, screenshot):
    page = browser_context.new_page()
    try:
        page.set_viewport_size({"width": WIDTH, "height": 844})
        page.set_default_timeout(30_000)
        page.goto(app_server, wait_until="load")
        page.wait_for_selector("#generate-btn")
        shown = _visible_tab_buttons(page)
        assert all(t in shown for t in TABS), shown
        # ... and every one of them looks like a tab: a tab of the strip, styled as the first one
        looks = page.evaluate("""() => [...document.querySelectorAll('.tab-wrapper button')]
            .filter((b) => b.offsetParent !== null && b.closest('.visually-hidden') === null && b.closest('#learn-tabs') === null)
            .map((b) => { const s = getComputedStyle(b);
              return [b.textContent.trim(), b.getAttribute('role'), s.fontSize, s.paddingLeft, s.height]; })""")
        assert {name for name, *_ in looks} >= set(TABS), looks
        assert all(role == "tab" for _, role, *_ in looks), looks
        assert len({tuple(style) for _, _, *style in looks}) == 1, looks
        # the model card's table fits the phone: every cell whole on the screen, nothing cut at the edge
        card = page.evaluate("""[...document.querySelectorAll('#model-card th, #model-card td')].map((c) =>
            [c.textContent.trim(), c.getBoundingClientRect().left, c.getBoundingClientRect().right])""")
        assert len(card) == 14 and all(left >= 0 and right <= WIDTH for _, left, right in card), card
        # the page never scrolls sideways: wide content scrolls inside its own box
        assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH + 1
        # the model card's table keeps words whole: no header cell narrower than its longest word
        cells = page.evaluate("""() => [...document.querySelectorAll('.prose table th')].map((c) =>
            ({text: c.textContent.trim(), height: c.getBoundingClientRect().height,
              line: parseFloat(getComputedStyle(c).lineHeight) || 20}))""")
        assert cells, "the model card table is on the Generate tab"
        assert all(c["height"] < 2.5 * c["line"] for c in cells), cells
        page.locator(".tab-wrapper button:not([tabindex='-1'])", has_text="Memory").first.click()
        page.wait_for_selector("#memory-summary")
        assert page.locator("#memory-summary").is_visible()
        # chart titles wrap to the phone's width instead of running off the chart's edge
        page.locator("#memory-size .gtitle").wait_for()
        titles = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].filter((p) => p.offsetParent !== null)
            .map((p) => { const t = p.querySelector('.gtitle'); if (!t) return null;
              const a = p.getBoundingClientRect(), b = t.getBoundingClientRect();
              return [t.textContent, b.left >= a.left - 1 && b.right <= a.right + 1]; }).filter((x) => x)""")
        assert titles and all(inside for _, inside in titles), titles
        # a results table: headers on one line each (never "agreem ent"), the table scrolls inside its box
        heads = page.evaluate("""[...document.querySelectorAll('#memory-table th')].map((c) =>
            [c.textContent.trim(), getComputedStyle(c).wordBreak, c.getBoundingClientRect().height])""")
        assert heads and all(wb == "normal" and h < 45 for _, wb, h in heads), heads
        # a table that wraps its cells (wrap=True) still breaks only between words
        page.locator(".tab-wrapper button:not([tabindex='-1'])", has_text="Eviction").first.click()
        page.wait_for_selector("#evict-table th")
        breaks = page.evaluate("""[...document.querySelectorAll('#evict-table th, #evict-table th *')].map((c) =>
            [getComputedStyle(c).wordBreak, getComputedStyle(c).overflowWrap])""")
        assert breaks and all(b == ["normal", "normal"] for b in breaks), breaks
        assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH + 1
        screenshot(page, "phone_390_memory")
        page.screenshot(path="/tmp/present_phone_memory.png")
    finally:
        page.close()
