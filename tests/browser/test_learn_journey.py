"""A lecturer's journey through the Learn tab in presentation mode: every "show me" loads, answers reveal, large type."""

from __future__ import annotations

import re

import pytest

from kvviz.lessons.objectives import PITFALLS
from kvviz.lessons.questions import QUESTIONS

# how each view shows that a "show me" example has loaded: (element, text that must appear)
READY = {
    "tab_generate": ("#gen-status", r"^Done"),
    "tab_memory": ("#memory-summary", r"KiB|GiB"),
    "tab_quant": ("#quant-headline", r"2 bits|too short"),
    "tab_nocache": ("#nocache-summary", r"Same tokens"),
    "tab_blocks": ("#leak-summary", r"Shared store"),
    "tab_attention": ("#attn-status", r"\S"),
    "tab_eviction": ("#evict-verdict", r"\S"),
    "tab_breakcache": ("#breakcache-verdict", r"divergence|Divergence|diverge"),
}
# a show-me whose view has its own result line (beside its tab's): what it shows once loaded
READY_BY_ANCHOR = {
    "arch-summary": ("#arch-summary", r"Cache measured from its tensors"),
    "evict-table": ("#evict-verdict", r"Full cache answered"),  # a comparison's verdict (the needle demo's differs)
    "disk-demo-chart": ("#disk-demo-summary", r"came back from disk"),
    "chat-turns": ("#chat-diff", r"Turn 2:"),  # the stored two-turn chat (the Generate tab's status does not change)
    "evict-sinks-plot": ("#evict-sinks-result", r"Perplexity after"),  # the sinks demo (the verdict is the needle's)
    "kvbudget-note": ("#kvbudget-note", r"MiB of KV"),  # the stored KV-budget replays, drawn as the Blocks tab opens
}


# views that may show the same text again: the Eviction tab's first open already draws the stored sinks demo, the
# Blocks tab's build the KV-budget replays
SAME_AGAIN = {"evict-sinks-plot", "kvbudget-note"}


def ready_for(sm) -> tuple[str, str] | None:
    return READY_BY_ANCHOR.get(sm.anchor or "") or READY.get(sm.tab)


TAB_TITLES = {
    "tab_generate": "Generate",
    "tab_attention": "Attention",
    "tab_eviction": "Eviction",
    "tab_memory": "Memory",
    "tab_quant": "Quantization",
    "tab_nocache": "Cache vs no cache",
    "tab_blocks": "Blocks",
    "tab_breakcache": "Break the cache",
}
LONG = 180_000  # ms: a show-me may start a generation on a busy CPU


def selected_tabs(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('button[role=tab][aria-selected=true]')].map(b => b.innerText)")


def tab_exists(page, tab: str) -> bool:
    return page.get_by_role("tab", name=TAB_TITLES[tab], exact=True).count() > 0


# a view's own text: its markdown, without the progress tracker Gradio draws in the same block ("0.8s",
# "queue: 1/1 | 0.1/2.8s"), whose timer changes the block's text while a new run has not yet changed the view's
OWN_TEXT = "(e => (e.querySelector('.prose') || e).innerText.trim())"
# the view named by ``sel`` shows a text matching ``pat``, and (``change``) one other than ``old``
SHOWS = (
    "([sel, pat, old, change]) => { const e = document.querySelector(sel); if (!e) return false;"
    f" const t = {OWN_TEXT}(e); return new RegExp(pat).test(t) && (!change || t !== old); }}"
)


def text_of(page, selector: str) -> str | None:
    loc = page.locator(selector)
    return loc.evaluate(f"e => {OWN_TEXT}(e)") if loc.count() else None


# where a tab's button is, once its bar is drawn: "open" (its panel is on screen), "bar" (a button in the bar),
# "menu" (Gradio moved it into the bar's "More tabs" menu) or false (the page has not drawn the bar yet)
FIND_TAB = """([scope, title, panel]) => {
  const mine = (b) => scope ? !!b.closest(scope) : !b.closest('#learn-tabs');
  const shown = (e) => !!e && e.getClientRects().length > 0;
  const named = (sel) => [...document.querySelectorAll(sel)].filter((b) => mine(b) && b.innerText.trim() === title);
  const bar = named('button[role=tab]');
  if (bar.some((b) => b.getAttribute('aria-selected') === 'true') && (!panel || shown(document.querySelector(panel))))
    return 'open';
  if (bar.some(shown)) return 'bar';
  return named('.overflow-dropdown button').length ? 'menu' : false;
}"""


def open_tab(page, scope: str | None, title: str, panel: str | None = None) -> None:
    """Select the tab ``title`` of the top bar (``scope`` None) or of the tabs inside ``scope``, wherever Gradio
    put its button: waits for the bar to be drawn (a page that has just loaded has none yet), then clicks the
    button in the bar or opens the bar's "More tabs" menu (large type on a narrow screen) and clicks it there."""
    where = page.wait_for_function(FIND_TAB, arg=[scope, title, panel], polling=50).json_value()
    if where == "open":
        return
    inside = f"{scope} " if scope else ""
    outside = "" if scope else ":not(#learn-tabs *)"
    if where == "bar":
        name = re.compile(rf"^\s*{re.escape(title)}\s*$")
        page.locator(f"{inside}button[role=tab]{outside}", has_text=name).filter(visible=True).first.click()
        return
    item = page.locator(
        f"{inside}.overflow-dropdown button{outside}", has_text=re.compile(rf"^\s*{re.escape(title)}\s*$")
    ).first
    if not item.is_visible():
        page.locator(f'{inside}.overflow-menu{outside} button[aria-label="More tabs"]').first.click()
    item.click()


def open_learn(page, inner: str) -> None:
    """The Learn tab, then its inner tab ``inner`` (e.g. "3 Size formula")."""
    open_tab(page, None, "Learn", "#learn-tabs")
    page.locator("#learn-tabs").wait_for()
    open_tab(page, "#learn-tabs", inner)


def show_me(page, button_id: str, sm, must_change: bool = True) -> None:
    """Click a show-me button and wait until its view has loaded the example."""
    ready = ready_for(sm)
    old = text_of(page, ready[0]) if ready else None
    missing = "not in this build yet" in page.locator(f"#{button_id}-note").inner_text()
    page.locator(f"#{button_id}").click()
    if missing:  # the page says the view is not built; the click must only warn, never break
        page.wait_for_timeout(500)
        assert "Learn" in selected_tabs(page)  # stays put
        return
    title = TAB_TITLES[sm.tab]
    page.wait_for_function(
        "t => [...document.querySelectorAll('button[role=tab][aria-selected=true]')]"
        ".some(b => b.innerText.trim() === t)",
        arg=title,
        timeout=LONG,
    )
    if ready:
        sel, pattern = ready
        page.wait_for_function(
            SHOWS,
            arg=[sel, pattern, old, must_change and sm.tab != "tab_attention"],
            timeout=LONG,
        )
    # the session has one model job at a time: the next show-me starts once this one's outputs settle
    page.wait_for_function(
        "() => ![...document.querySelectorAll('[data-testid=status-tracker]:not(.hide)')].some("
        "e => e.classList.contains('generating') || e.querySelector('.eta-bar, .progress-level,"
        " .loading'))",
        timeout=LONG,
    )


def assert_clean(page, errors) -> None:
    assert page.locator(".toast-body.error").count() == 0, page.locator(".toast-body.error").all_inner_texts()
    assert not errors, f"JavaScript errors in the page: {errors}"


@pytest.fixture
def stored_page(browser_context, examples_server):
    """A page on the server whose show-me examples were computed at start-up (as ``make run`` serves them): a
    show-me reads its stored result, as a lecturer's click does, instead of computing it on the click."""
    tab = browser_context.new_page()
    tab.set_default_timeout(30_000)
    tab.goto(examples_server.url, wait_until="load")
    tab.wait_for_selector("#generate-btn")
    yield tab
    tab.close()


def test_learn_journey_in_presentation_mode(stored_page, screenshot):
    page = stored_page
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.get_by_role("tab", name="Learn", exact=True).click()
    body_text = page.locator(".learn-objective p").first
    body_text.wait_for()
    normal = float(body_text.evaluate("e => parseFloat(getComputedStyle(e).fontSize)"))

    state = "() => getComputedStyle(document.getElementById('present-toggle'), '::after').content"
    assert page.evaluate(state) == '": off"'  # the toggle shows its state, not only its name
    page.locator("#present-toggle").click()
    assert page.evaluate("document.body.classList.contains('kvviz-present')")
    assert page.evaluate(state) == '": on"'
    big = float(body_text.evaluate("e => parseFloat(getComputedStyle(e).fontSize)"))
    tab_font = float(
        page.get_by_role("tab", name="Learn", exact=True).evaluate("e => parseFloat(getComputedStyle(e).fontSize)")
    )
    assert big >= 22 and big >= 1.3 * normal, (normal, big)  # large type for the back row
    assert tab_font >= 20
    note = page.locator(".learn-note").first  # what to look for: in large type, not hidden
    assert (
        note.is_visible()
        and float(note.evaluate("e => parseFloat(getComputedStyle(e.querySelector('p') || e).fontSize)")) >= 28
    )
    color = body_text.evaluate("e => getComputedStyle(e).color")
    assert color in ("rgb(0, 0, 0)", "rgb(17, 17, 17)"), color  # high contrast
    shot = screenshot(page, "learn_presentation")
    assert shot.stat().st_size > 10_000

    # the decode walkthrough steps with the arrow keys (before any show-me starts a generation that would
    # replace its trace when it finishes)
    open_learn(page, "2 Decode step")
    page.locator("#learn-load-example").click()
    page.locator("#learn-step-text").get_by_text("Step 0").wait_for(timeout=LONG)
    page.locator("#learn-step-text").click()
    page.keyboard.press("ArrowRight")
    page.locator("#learn-step-text").get_by_text("Step 1:").wait_for(timeout=30_000)
    page.keyboard.press("ArrowRight")
    page.locator("#learn-step-text").get_by_text("Step 2:").wait_for(timeout=30_000)
    assert page.locator("#learn-step input[type=range]").input_value() == "2"
    page.keyboard.press("ArrowLeft")
    page.locator("#learn-step-text").get_by_text("Step 1:").wait_for(timeout=30_000)

    # "Next objective" from the last objective to the questions, each answer computed now, then the pitfalls (every
    # show-me of the objectives and pitfalls is clicked, on this same server, by test_showme_walk)
    open_learn(page, "5 Shrinking it")
    page.locator("#learn-next-5").click()
    page.locator("#reveal-1").wait_for()

    for i, _ in enumerate(QUESTIONS, 1):
        page.locator(f"#reveal-{i}").click()
        page.locator(f"#answer-{i}").get_by_text("Computed by kvviz now", exact=False).wait_for(timeout=LONG)
    assert "128 KiB" in page.locator("#answer-1").inner_text()
    assert "evicted" in page.locator("#answer-4").inner_text()
    assert_clean(page, errors)
    page.locator("#learn-next-questions").click()
    page.locator("#pitfall-1").wait_for()
    # one show-me in the journey's own session: it opens its tab and loads its view
    show_me(page, "pitfall-1", PITFALLS[0].show_me, must_change=False)
    assert_clean(page, errors)
    screenshot(page, "learn_journey_end")


def test_present_url_parameter(browser_context, app_server):
    tab = browser_context.new_page()
    try:
        tab.goto(app_server + "?present=1", wait_until="load")
        tab.wait_for_function("document.body.classList.contains('kvviz-present')", timeout=30_000)
        tab.locator("#learn-tabs").wait_for(timeout=30_000)  # a lecture opens on the lesson, not on Generate
        assert [t.strip() for t in selected_tabs(tab)][0] == "Learn"
        assert tab.locator("#showme-1-1-note").is_visible()
    finally:
        tab.close()


def test_the_presentation_toggle_shows_its_state(page):
    page.get_by_role("tab", name="Learn", exact=True).click()
    page.locator("#present-toggle").wait_for()
    state = "getComputedStyle(document.getElementById('present-toggle'), '::after').content"
    assert page.evaluate(state) == '": off"'
    page.locator("#present-toggle").click()
    page.wait_for_function(f"{state} === '\": on\"'", timeout=10_000)  # the click runs its script asynchronously
    page.locator("#present-toggle").click()
    page.wait_for_function(f"{state} === '\": off\"'", timeout=10_000)
