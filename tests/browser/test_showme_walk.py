"""Every show-me lands its view once the start-up examples are ready: the tab, the result, the outline, in sight.

A server of its own computes the examples at start-up (KVVIZ_PRECOMPUTE=1); the test waits for the
Learn tab's readiness line, then, at 1920×1080 in presentation mode, clicks each show-me in lecture
order and waits until the view shows its result, outlined and in the viewport. The time of each
click is written with a screenshot per show-me under tests/browser/artifacts/; whether they meet the
2 s target is judged by ``bench/showme_speed.py`` (a speed target is a benchmark's, not a test's).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kvviz.lessons.objectives import OBJECTIVES, PITFALLS
from tests.browser.test_learn_journey import READY, TAB_TITLES, open_learn, selected_tabs, text_of
from tests.server import start_app, stop_app

ARTIFACTS = Path(__file__).parent / "artifacts"
READY_TIMEOUT_MS = 1_800_000  # the examples on a busy 2-core machine (a few minutes when it is quiet)
IDLE = (
    "() => ![...document.querySelectorAll('[data-testid=status-tracker]:not(.hide)')].some("
    "e => e.classList.contains('generating') || e.querySelector('.eta-bar, .progress-level, .loading'))"
)
# the named view is on screen and drawn (a plot has left its empty state and plotly has drawn it)
IN_VIEW = (
    "id => { const e = document.getElementById(id); if (!e || !e.getClientRects().length) return false;"
    " if (e.querySelector('[aria-label=\"Empty value\"]')) return false;"
    " const p = e.querySelector('.js-plotly-plot'); if (p && !p.querySelector('.main-svg')) return false;"
    " const r = e.getBoundingClientRect(); return r.bottom > 0 && r.top < innerHeight && r.height > 0; }"
)

# the outline lasts a few seconds; a busy page can run its removal before a poll sees it, so an observer
# notes every element that gains it
WATCH_SPOT = """id => {
  if (!window.__kvvizSpotted) {
    window.__kvvizSpotted = new Set();
    new MutationObserver((records) => { for (const r of records)
      if (r.target.id && r.target.classList.contains('kvviz-spot')) window.__kvvizSpotted.add(r.target.id); }
    ).observe(document.body, {subtree: true, attributes: true, attributeFilter: ['class']});
  }
  window.__kvvizSpotted.delete(id);
}"""


@pytest.fixture(scope="module")
def ready_server(tmp_path_factory):
    """A server that computes the show-me examples in the background as it starts."""
    running = start_app(tmp_path_factory.mktemp("showme-server"), {"KVVIZ_PRECOMPUTE": "1"})
    yield running
    stop_app(running.proc)


def show_mes() -> list[tuple[str, object]]:
    """(button id, show-me) in lecture order, each example once."""
    out, seen = [], set()
    for obj in OBJECTIVES:
        for j, sm in enumerate(obj.show_me, 1):
            out.append((f"showme-{obj.number}-{j}", sm, f"{obj.number} {obj.title}"))
            seen.add(sm.label)
    for i, pit in enumerate(PITFALLS, 1):
        if pit.show_me.label not in seen:
            seen.add(pit.show_me.label)
            out.append((f"pitfall-{i}", pit.show_me, "Pitfalls"))
    return out


def click_and_time(page, button_id: str, sm, timeout_ms: int = 60_000) -> float:
    """Seconds from the click until the view shows its result, idle, with the named view in the viewport."""
    ready = READY.get(sm.tab)
    old = text_of(page, ready[0]) if ready else None
    change = sm.tab not in ("tab_attention", "tab_memory")  # these may show the same text again
    page.evaluate(WATCH_SPOT, sm.anchor)
    t0 = time.perf_counter()
    page.locator(f"#{button_id}").click()
    page.wait_for_function(
        "t => [...document.querySelectorAll('button[role=tab][aria-selected=true]')]"
        ".some(b => b.innerText.trim() === t)",
        arg=TAB_TITLES[sm.tab],
        timeout=timeout_ms,
        polling=50,
    )
    page.wait_for_function(  # the named view was outlined (seen by WATCH_SPOT even if it has faded since)
        "id => window.__kvvizSpotted.has(id)", arg=sm.anchor, timeout=timeout_ms, polling=50
    )
    if ready:
        page.wait_for_function(
            "([sel, pat, old, change]) => { const e = document.querySelector(sel); if (!e) return false;"
            " const t = e.innerText.trim(); return new RegExp(pat).test(t) && (!change || t !== old); }",
            arg=[ready[0], ready[1], old, change],
            timeout=timeout_ms,
            polling=50,
        )
    page.wait_for_function(IDLE, timeout=timeout_ms, polling=50)
    page.wait_for_function(IN_VIEW, arg=sm.anchor, timeout=timeout_ms, polling=50)
    return time.perf_counter() - t0


def test_every_show_me_lands_its_view_in_presentation_mode(browser_context, ready_server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.set_viewport_size({"width": 1920, "height": 1080})
        page.set_default_timeout(60_000)
        page.goto(ready_server.url + "?present=1", wait_until="load")
        page.locator("#learn-tabs").wait_for()  # presentation mode opens on the Learn tab
        assert [t.strip() for t in selected_tabs(page)][0] == "Learn"
        page.locator("#learn-ready").get_by_text("all", exact=False).wait_for(timeout=READY_TIMEOUT_MS)
        assert page.evaluate("document.body.classList.contains('kvviz-present')")

        times: dict[str, float] = {}
        for button_id, sm, inner in show_mes():
            open_learn(page, inner)
            note = page.locator(f"#{button_id}-note").inner_text() if page.locator(f"#{button_id}-note").count() else ""
            if "not in this build yet" in note:
                continue
            look = page.locator(f"#{button_id}-note")  # the point of the view, readable by the room
            assert look.is_visible() and "Look for" in look.inner_text(), button_id
            try:
                times[sm.label] = click_and_time(page, button_id, sm)
            except Exception as exc:
                page.screenshot(path=str(ARTIFACTS / f"{button_id}-failed.png"))
                raise AssertionError(f"show-me {sm.label!r} ({button_id}) did not land its view: {exc}") from exc
            page.screenshot(path=str(ARTIFACTS / f"{button_id}.png"))
        (ARTIFACTS / "showme_times.json").write_text(json.dumps(times, indent=2))
        print("\nshow-me times (s):")
        for label, seconds in times.items():
            print(f"  {seconds:5.2f}  {label}")
        assert len(times) >= 8
        assert page.locator(".toast-body.error").count() == 0, page.locator(".toast-body.error").all_inner_texts()
        assert not errors, errors
    finally:
        page.close()
