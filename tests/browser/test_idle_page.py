"""An open page that nobody touches asks the browser for no frames (kvviz/ui/page/status_timer.py).

Gradio's status tracker of the start-up loading status leaves the page while pending and keeps asking for a frame
sixty times a second for as long as the page is open; on a lecturer's laptop that is the model's cores. The
frames a page draws are counted from Chromium's own trace (``FireAnimationFrame``: one per frame that ran a
``requestAnimationFrame`` callback).
"""

from __future__ import annotations

import json
import time

IDLE_S = 2.0  # one window of the trace
WINDOWS = 6
QUIET_FRAMES = 5  # a frame or two for a late reply's redraw; a loop runs ~120


def frames_fired(tab, seconds: float) -> int:
    """``requestAnimationFrame`` callbacks' frames the browser ran in the next ``seconds``, from a trace over CDP."""
    cdp = tab.context.new_cdp_session(tab)
    done: list[dict] = []
    cdp.on("Tracing.tracingComplete", lambda event: done.append(event))
    cdp.send("Tracing.start", {"categories": "devtools.timeline", "transferMode": "ReturnAsStream"})
    tab.wait_for_timeout(seconds * 1000)
    cdp.send("Tracing.end")
    deadline = time.monotonic() + 30
    while not done and time.monotonic() < deadline:
        tab.wait_for_timeout(50)
    assert done, "Chromium sent no trace"
    handle, chunks = done[0]["stream"], []
    while True:
        part = cdp.send("IO.read", {"handle": handle})
        chunks.append(part["data"])
        if part.get("eof"):
            break
    cdp.send("IO.close", {"handle": handle})
    cdp.detach()
    trace = json.loads("".join(chunks))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return sum(1 for e in events if e.get("name") == "FireAnimationFrame")


def test_an_idle_page_asks_for_no_frames_and_the_pages_own_animations_keep_theirs(page):
    # the start-up loading screen's spinner finishes its last turn of ~4 s after the page is up: a page that has
    # gone quiet within WINDOWS windows stays quiet, a leaked status timer never does
    counts = []
    for _ in range(WINDOWS):
        counts.append(frames_fired(page, IDLE_S))
        if counts[-1] <= QUIET_FRAMES:
            break
    assert counts[-1] <= QUIET_FRAMES, f"an idle page ran {counts} animation frames per {IDLE_S:.0f} s (a timer loop?)"
    # a loop of the page's own (plotly's, Svelte's) still gets every frame: the measure sees a loop when there is one
    page.evaluate("() => { const tick = () => { if (!window.stopTick) requestAnimationFrame(tick); }; tick(); }")
    own = frames_fired(page, IDLE_S)
    page.evaluate("() => { window.stopTick = true; }")
    assert own >= 30 * IDLE_S, f"the page's own animation loop ran only {own} frames in {IDLE_S:.0f} s"
