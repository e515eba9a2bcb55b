"""Lecture features in a real browser: deep links and Copy link, presentation-sized charts without
overlaps, arrow keys, and play/pause replaying a finished run."""

from __future__ import annotations

import json

import pytest

from tests.browser.form import generate

LONG = 180_000
OVERLAP_JS = """() => {
  const boxes = [];
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    if (plot.offsetParent === null) continue;
    const block = plot.closest('.block'), label = block && block.querySelector('[data-testid=block-label]');
    const title = plot.querySelector('.gtitle');
    if (!label || !title) continue;
    const a = label.getBoundingClientRect(), b = title.getBoundingClientRect();
    const hit = a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
    boxes.push([block.id, hit, parseFloat(title.style.fontSize || getComputedStyle(title).fontSize)]);
  }
  return boxes;
}"""


def open_page(browser_context, url: str, width: int = 1400, height: int = 1000):
    tab = browser_context.new_page()
    tab.set_default_timeout(30_000)
    tab.set_viewport_size({"width": width, "height": height})
    tab.goto(url, wait_until="load")
    tab.wait_for_selector("#copy-link")  # above the tabs: visible whichever tab the link opens
    return tab


def test_a_deep_link_opens_the_view_and_copy_link_gives_it_back(browser_context, app_server):
    tab = open_page(browser_context, app_server + "?tab=memory&config=DeepSeek-V3&context=131072&batch=1e99")
    try:
        tab.wait_for_function(
            "document.querySelector('.tab-wrapper button[role=tab][aria-selected=true]')?.innerText.trim() === 'Memory'",
            timeout=30_000,
        )
        tab.locator("#memory-summary").get_by_text("131,072 tokens", exact=False).wait_for(timeout=30_000)
        assert tab.get_by_label("Context (tokens per sequence)").input_value() == "131072"
        assert "ignored" in tab.locator("#link-note").inner_text()  # the hostile batch, noted, not applied
        assert tab.get_by_label("Batch (sequences)").input_value() == "1"
        tab.locator("#copy-link").click()
        tab.wait_for_function("document.querySelector('#link-url textarea, #link-url input')?.value.includes('tab=')")
        url = tab.locator("#link-url textarea, #link-url input").first.input_value()
        assert url.startswith(app_server.rstrip("/"))
        assert "tab=memory" in url and "config=DeepSeek-V3" in url and "context=131072" in url
    finally:
        tab.close()
    tab = open_page(browser_context, app_server + "?tab=attention&layer=5&head=3")
    try:
        tab.wait_for_function("document.querySelector('#attn-layer input[type=number]')?.value === '5'")
        assert tab.locator("#attn-head input").input_value().startswith("q3")
    finally:
        tab.close()


def test_a_link_s_text_is_echoed_as_plain_text_never_as_a_link_image_or_style(browser_context, app_server):
    from urllib.parse import quote, urlsplit

    pixel = app_server + "px.png"  # a tracking pixel would be fetched from the server itself: no request may reach it
    hostile = [  # (name, value, what the note must show as text)
        ("tab", "[log in again](http://127.0.0.1:9/login)", "[log in again](http"),
        ("tab", f"![a]({pixel})", "![a](http"),
        ("tab", f"<img src={pixel}>", "<img src=http"),
        ("<b style=color:red;font-size:99px>X</b>", "1", "<b style=color:red"),
    ]
    for name, value, text in hostile:
        tab = browser_context.new_page()
        asked: list[str] = []
        tab.on(
            "request", lambda r, asked=asked: asked.append(r.url) if urlsplit(r.url).path.endswith("px.png") else None
        )
        tab.set_default_timeout(30_000)
        try:
            tab.goto(f"{app_server}?{quote(name)}={quote(value)}", wait_until="load")
            note = tab.locator("#link-note")
            note.get_by_text("ignored", exact=False).wait_for()
            inside = note.evaluate(
                "n => ({links: n.querySelectorAll('a').length, images: n.querySelectorAll('img').length,"
                " styled: n.querySelectorAll('p [style]').length, bold: n.querySelectorAll('b').length})"
            )
            assert inside == {"links": 0, "images": 0, "styled": 0, "bold": 0}, (name, value, inside)
            assert text in note.inner_text(), (text, note.inner_text())
            tab.wait_for_timeout(300)
            assert not asked, f"the note made the browser fetch {asked}"
        finally:
            tab.close()


@pytest.mark.parametrize("width,height", [(1280, 720), (1920, 1080)])
def test_presentation_mode_enlarges_chart_text_without_covering_titles(browser_context, app_server, width, height):
    plain = open_page(browser_context, app_server + "?tab=memory", width, height)
    big = open_page(browser_context, app_server + "?tab=memory&present=1", width, height)
    try:
        for tab in (plain, big):
            tab.locator("#memory-size .gtitle").wait_for(timeout=30_000)
        big.wait_for_function("() => parseFloat(document.querySelector('#memory-size .gtitle')?.style.fontSize) > 20")
        normal = {b[0]: b for b in plain.evaluate(OVERLAP_JS)}
        shown = big.evaluate(OVERLAP_JS)
        assert shown, "no labelled chart with a title on the Memory tab"
        for elem_id, hit, size in shown:
            assert not hit, f"{elem_id}: the panel label covers the chart title at {width}×{height}"
            if elem_id in normal:
                assert size >= 1.2 * normal[elem_id][2], (elem_id, size, normal[elem_id][2])
        ticks = "() => parseFloat(document.querySelector('#memory-size .xtick text').style.fontSize)"
        assert big.evaluate(ticks) >= 1.4 * plain.evaluate(ticks)  # tick labels scale through the layout too
    finally:
        plain.close()
        big.close()


def close_to(a, b) -> bool:
    """JSON values equal, numbers to 1e-9 (Python's and the page's arithmetic)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close_to(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close_to(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a))
    return a == b


def test_the_page_scales_a_figure_as_scaled_does(browser_context, app_server):
    """The browser's copy of kvviz.figures.scale.scaled gives the same figure, up and back down."""
    from kvviz.figures.scale import PRESENT_SCALE, scaled
    from tests.figures.test_scale import sample

    tab = open_page(browser_context, app_server)
    try:
        tab.wait_for_function("!!window.kvvizPresent")
        fig = sample()
        scale = "([fig, f]) => { const [data, layout] = window.kvvizPresent.scale(fig.data, fig.layout, f); return {data, layout}; }"
        big = tab.evaluate(scale, [json.loads(fig.to_json()), PRESENT_SCALE])
        want = json.loads(scaled(fig, PRESENT_SCALE).to_json())
        assert close_to(big, want), (big["layout"], want["layout"])
        back = tab.evaluate(scale, [big, 1.0])
        assert close_to(back, json.loads(scaled(scaled(fig, PRESENT_SCALE), 1.0).to_json()))
    finally:
        tab.close()


def test_the_toggle_rescales_drawn_charts_in_the_page(browser_context, app_server):
    tab = open_page(browser_context, app_server + "?tab=memory")
    sent: list[str] = []
    tab.on("request", lambda r: sent.append(r.url) if "gradio_api" in r.url else None)
    title = "parseFloat(document.querySelector('#memory-size .gtitle')?.style.fontSize)"
    try:
        tab.locator("#memory-size .gtitle").wait_for()
        plain = tab.evaluate(title)
        tab.get_by_role("tab", name="Learn", exact=True).click()
        tab.locator("#present-toggle").wait_for()
        before = len(sent)
        tab.locator("#present-toggle").click()  # the Memory chart, drawn on its (now hidden) tab, is redrawn
        tab.wait_for_function(f"{title} >= 1.2 * {plain}")
        tab.locator("#present-toggle").click()
        tab.wait_for_function(f"{title} === {plain}")
        assert sent[before:] == [], sent[before:]  # no chart went to the server and back
    finally:
        tab.close()


def test_plotly_loads_while_the_page_is_idle_and_only_once(browser_context, examples_server):
    # the Generate tab opens drawn from the stored example: on the server that computed its examples at start-up
    # (the shared server computes none: there the first screen only draws once some test has run that example)
    tab = open_page(browser_context, examples_server.url)
    chunks = "performance.getEntriesByType('resource').filter((e) => e.name.includes('/PlotlyPlot-')).length"
    try:
        tab.wait_for_function("!!(window.Plotly && window.Plotly.react)", timeout=30_000)
        tab.locator("#cache-growth .gtitle").wait_for()  # the first tab's charts are drawn at first sight
        assert tab.evaluate(chunks) == 1
        tab.get_by_role("tab", name="Memory", exact=True).click()
        tab.locator("#memory-size .gtitle").wait_for()
        assert tab.evaluate(chunks) == 1  # Gradio's own import found the preloaded module
    finally:
        tab.close()


def slider_value(page, elem_id: str) -> int:
    return int(float(page.locator(f"#{elem_id} input[type=range]").input_value()))


def test_play_replays_a_run_and_arrow_keys_step_it(page):
    generate(page, "Once upon a time", 24, timeout_ms=LONG)
    page.wait_for_function("parseFloat(document.querySelector('#gen-step input[type=range]')?.max) >= 10")

    page.locator("#gen-play").click()  # at the end: play starts over from step 0
    page.wait_for_function("parseFloat(document.querySelector('#gen-step input[type=range]')?.value) >= 3")
    page.locator("#gen-play").click()  # pause
    held = slider_value(page, "gen-step")
    page.wait_for_timeout(1200)
    assert slider_value(page, "gen-step") == held
    assert held < 20
    page.wait_for_function(f"document.querySelector('#cache-growth .gtitle')?.textContent.includes('step {held}:')")

    # presentation mode: → steps the open tab's slider, but not while typing in the prompt
    page.evaluate("document.body.classList.add('kvviz-present')")
    page.locator("#gen-status").click()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(f"document.querySelector('#gen-step input[type=range]')?.value === '{held + 1}'")
    page.locator("#prompt textarea").click()
    page.keyboard.press("ArrowRight")
    page.wait_for_timeout(500)
    assert slider_value(page, "gen-step") == held + 1

    # Attention replays the same run: play moves its step slider, pause holds it
    page.get_by_role("tab", name="Attention").click()
    page.locator("#attn-step-chart .js-plotly-plot").wait_for(timeout=60_000)
    start = slider_value(page, "attn-step")
    page.locator("#attn-play").click()
    page.wait_for_function(
        f"parseFloat(document.querySelector('#attn-step input[type=range]')?.value) >= {0 if start >= 10 else start} + 2"
    )
    page.locator("#attn-play").click()
    held = slider_value(page, "attn-step")
    page.wait_for_timeout(1000)
    assert slider_value(page, "attn-step") == held
