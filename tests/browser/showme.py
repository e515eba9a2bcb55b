"""What the show-me walks share: every show-me in lecture order, and a click timed until its view has landed
(the tab, the result, the outline, in the viewport). Used by tests/browser/test_showme_walk.py (examples ready
at start-up) and tests/browser/test_showme_restart.py (a restarted server answering from its stored results).
"""

from __future__ import annotations

import re
import time

from kvviz.lessons.objectives import CAUSAL_DECODE, FORGET_APPEND, OBJECTIVES, PITFALLS
from kvviz.lessons.showme import (
    CHAT_REUSE,
    DISK_TIER,
    KV_BUDGET,
    KVZIP_SNAPKV,
    LIVE_GQA,
    LIVE_MLA,
    LIVE_NOTE,
    LIVE_SHARING,
    LIVE_STATE,
)
from tests.browser.test_learn_journey import SAME_AGAIN, SHOWS, TAB_TITLES, ready_for, text_of

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
    ready = ready_for(sm)
    old = text_of(page, ready[0]) if ready else None
    change = sm.tab not in ("tab_attention", "tab_memory") and sm.anchor not in SAME_AGAIN  # may show it again
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
            SHOWS,
            arg=[ready[0], ready[1], old, change],
            timeout=timeout_ms,
            polling=50,
        )
    page.wait_for_function(IDLE, timeout=timeout_ms, polling=50)
    page.wait_for_function(IN_VIEW, arg=sm.anchor, timeout=timeout_ms, polling=50)
    return time.perf_counter() - t0


# show-mes whose "Look for" line is read from their stored result: where the view shows each of its numbers
LOOK_FOR_SHOWN = {
    **{sm.label: ("#arch-summary",) for sm in (LIVE_GQA, LIVE_MLA, LIVE_SHARING, LIVE_STATE)},
    **{sm.label: ("#breakcache-verdict",) for sm in (CAUSAL_DECODE, FORGET_APPEND)},
    KVZIP_SNAPKV.label: ("#evict-verdict", "#evict-table"),  # the full cache's answer, each policy's row
    DISK_TIER.label: ("#disk-demo-summary",),
    CHAT_REUSE.label: ("#chat-diff",),
    KV_BUDGET.label: ("#kvbudget-note",),
}
NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"


def look_for_numbers(page, button_id: str, sm, timeout_ms: int = 60_000) -> list[str]:
    """The numbers of the show-me's "Look for" line once it is read from the stored result (before the click)."""
    if sm.label not in LOOK_FOR_SHOWN:
        return []
    page.wait_for_function(  # the line computed from the result, not the placeholder shown until it is ready
        "([id, wait]) => { const e = document.getElementById(id); return !!e && !e.innerText.includes(wait); }",
        arg=[f"{button_id}-note", LIVE_NOTE],
        timeout=timeout_ms,
        polling=100,
    )
    numbers = re.findall(NUMBER, page.locator(f"#{button_id}-note").inner_text())
    assert numbers, (button_id, sm.label)
    return numbers


def numbers_on_screen(page, sm, numbers: list[str]) -> None:
    """Each of the "Look for" line's numbers is shown in the view the show-me opened."""
    if not numbers:
        return
    views = [page.locator(sel) for sel in LOOK_FOR_SHOWN[sm.label]]
    text = "\n".join(v.inner_text() for v in views)
    shown = set(re.findall(NUMBER, text))  # whole numbers, so "2" is not found inside "2026"
    missing = [n for n in numbers if n not in shown]
    assert all(v.is_visible() for v in views) and not missing, (sm.label, missing, text[:900])
