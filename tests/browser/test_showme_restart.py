"""A restarted server answers every show-me from the results its earlier start stored on disk.

The session's first server (``examples_server``) computes the show-me examples at start-up into a private results
folder (KVVIZ_RESULTS_DIR) until the Learn tab says all are ready; a second one starts on the same folder. As soon as it answers HTTP 200 a page opens at 1920×1080 in presentation mode: the Learn
tab must be open first; then every show-me is clicked in lecture order (the room clicks as soon as the
page is up), each with its "Look for" line in sight, and its view must show the show-me's own numbers,
read from disk, without ever saying "not ready". The seconds from the first HTTP 200 to the first click
and each click's seconds go to tests/browser/artifacts/showme_restart_times.json, where
``bench/showme_speed.py --cold-restart`` judges them against the 5 s and 2 s targets (timing is the
bench's, not this test's).

With ``KVVIZ_RESTART_NO_STORE=1`` (the bench's "before") there is no first server and the second stores
nothing: a fresh start as the app had before results were stored, each click waiting for its computation.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from tests.browser.showme import click_and_time, look_for_numbers, numbers_on_screen, show_mes
from tests.browser.test_learn_journey import open_learn, selected_tabs
from tests.server import start_app, stop_app

ARTIFACTS = Path(__file__).parent / "artifacts"
NO_STORE = os.environ.get("KVVIZ_RESTART_NO_STORE") == "1"
START_S = 600.0  # a loaded machine loads the model slowly; the clock starts at the first HTTP 200 anyway
CLICK_TIMEOUT_MS = 1_800_000 if NO_STORE else 60_000  # without a store a click waits for its computation
# a result read back from the store says so in its view ("computed by an earlier start …, read from disk")
FROM_DISK = "read from disk"
# what each show-me's view must show: (element, pattern), the show-me's own numbers or, for a view drawn
# from a stored result, where it came from
SHOWS = {
    "Time both loops (cache vs no cache)": ("#nocache-summary", rf"Same tokens[\s\S]*{FROM_DISK}"),
    "Count the waste of a real run": ("#gen-status", rf"Done: 16 tokens[\s\S]*{FROM_DISK}"),
    "Generate and check cached = recomputed": ("#gen-status", rf"Done: \d+ tokens?[\s\S]*{FROM_DISK}"),
    "Calculator on Llama-3-70B at 8K": ("#memory-formula", r"320 KiB[\s\S]*2\.5 GiB"),
    "… and at 128K": ("#memory-formula", r"40 GiB"),
    "Batch capacity on 8 × H100": ("#memory-capacity", r"162"),
    "Decode time: weights vs KV": ("#memory-decode", r"5\.2 ms"),
    "Needle demo under eviction": ("#evict-verdict", rf"4721[\s\S]*{FROM_DISK}"),
    "KIVI: outlier key channels, 2-bit": ("#quant-headline", r"2 bits"),
    "The formula, with numbers": ("#memory-formula", r"320 KiB"),
    "MHA / GQA / MQA / MLA table": ("#memory-table", r"2\.5 MiB"),
    "DeepSeek-V3 in the calculator": ("#memory-formula", r"70,272"),
    "Llama-3-70B at TP = 16": ("#memory-summary", r"TP 16"),
    "Sink map of the real model": ("#attn-status", r"Run of \d+ prompt \+ \d+ generated tokens"),
    "Perplexity with and without the sink tokens": ("#evict-sinks-result", rf"Perplexity after[\s\S]*{FROM_DISK}"),
    "Time a second session": ("#leak-summary", rf"Shared store[\s\S]*{FROM_DISK}"),
    "MLA live: a latent instead of per-head K/V": ("#arch-summary", r"1,280 B per token"),
    "Gemma-4's cross-layer KV sharing, live": ("#arch-summary", r"only layer 1 of the 6 grows"),
    "Qwen3-Next's linear-attention state, live": ("#arch-summary", r"11,008 B"),
    "GQA live: query heads sharing K/V heads": ("#arch-summary", r"2 KV heads[\s\S]*512 B"),
    "Decode with a causal mask": ("#breakcache-verdict", rf"First divergence: step 2, layer 0[\s\S]*{FROM_DISK}"),
    "Forget to append": ("#breakcache-verdict", rf"First divergence: step 2, layer 0[\s\S]*{FROM_DISK}"),
    "KVzip vs SnapKV, only the context compressed": ("#evict-verdict", rf"Full cache answered[\s\S]*{FROM_DISK}"),
    "Chat: the next turn starts from this one's cache": ("#chat-diff", rf"Turn 2: [\d,]+ of [\d,]+[\s\S]*{FROM_DISK}"),
    "The disk tier: blocks spill and come back": ("#disk-demo-summary", rf"came back from disk[\s\S]*{FROM_DISK}"),
    "Measured: the room served under a KV budget": ("#kvbudget-note", r"At 720\.0 MiB of KV:.*Paged runs"),
}
# any text a view shows while its result is still being computed (kvviz/ui/serving/precompute.py)
WATCH_WAITING = r"""() => {
  window.__kvvizWaiting = [];
  const pat = /Not ready yet|Being prepared at start-up/;
  const seen = (t) => { if (t && pat.test(t)) window.__kvvizWaiting.push(t.trim().slice(0, 160)); };
  new MutationObserver((records) => { for (const r of records) {
    if (r.type === 'characterData') seen(r.target.data);
    for (const n of r.addedNodes || []) seen(n.textContent);
  } }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
# inside the viewport, to a pixel (a scrolled layout lands on fractions of one)
IN_VIEWPORT = (
    "e => { const r = e.getBoundingClientRect(); return r.height > 0 && r.top >= -1 && r.left >= -1"
    " && r.bottom <= innerHeight + 1 && r.right <= innerWidth + 1; }"
)


def look_for_in_sight(page, button_id: str) -> None:
    """The show-me's button and its "Look for" line (just below it) brought on screen together, as a lecturer
    scrolls before clicking: both lie within the viewport, so the room reads what to look for."""
    note = page.locator(f"#{button_id}-note")
    note.scroll_into_view_if_needed()
    assert "Look for" in note.inner_text(), button_id
    for el in (page.locator(f"#{button_id}"), note):
        assert el.evaluate(IN_VIEWPORT), (button_id, el.bounding_box(), page.viewport_size)


def shows(page, label: str) -> None:
    """The view shows the show-me's own numbers (and, from a stored result, that it was read from disk)."""
    sel, pattern = SHOWS[label]
    if NO_STORE:  # computed now: only the numbers
        pattern = pattern.replace(rf"[\s\S]*{FROM_DISK}", "").replace(FROM_DISK, r"\S")
    text = page.locator(sel).inner_text()
    assert re.search(pattern, text), (label, sel, pattern, text[:400])


def test_a_restarted_server_answers_every_show_me_from_its_store(browser_context, tmp_path, request):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # the folder a first start of this code filled (the session's examples server), unless the bench's "before"
    results = None if NO_STORE else request.getfixturevalue("examples_server").results
    env = {"KVVIZ_PRECOMPUTE": "1", "KVVIZ_RESULTS_DIR": "0" if results is None else str(results)}
    second = start_app(tmp_path / "second", env, timeout_s=START_S)
    answered = time.perf_counter()
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.set_viewport_size({"width": 1920, "height": 1080})
        page.set_default_timeout(60_000)
        page.goto(second.url + "?present=1", wait_until="load")
        page.locator("#learn-tabs").wait_for()  # presentation mode opens on the Learn tab
        assert [t.strip() for t in selected_tabs(page)][0] == "Learn"
        assert page.evaluate("document.body.classList.contains('kvviz-present')")
        page.evaluate(WATCH_WAITING)
        times: dict[str, float] = {}
        report: dict = {"store": not NO_STORE, "first_click_after_http_s": None, "seconds": times}
        for button_id, sm, inner in show_mes():
            open_learn(page, inner)
            look_for_in_sight(page, button_id)
            if report["first_click_after_http_s"] is None:
                report["first_click_after_http_s"] = time.perf_counter() - answered
            numbers = look_for_numbers(page, button_id, sm, CLICK_TIMEOUT_MS)
            try:
                times[sm.label] = click_and_time(page, button_id, sm, CLICK_TIMEOUT_MS)
                shows(page, sm.label)
                numbers_on_screen(page, sm, numbers)
            except Exception as exc:
                page.screenshot(path=str(ARTIFACTS / f"restart-{button_id}-failed.png"))
                raise AssertionError(f"show-me {sm.label!r} ({button_id}) did not land its view: {exc}") from exc
            (ARTIFACTS / "showme_restart_times.json").write_text(json.dumps(report, indent=2))  # kept as it goes
        assert set(times) == set(SHOWS), sorted(times)
        if not NO_STORE:
            assert page.evaluate("window.__kvvizWaiting") == [], "a show-me waited for a computation"
            assert "read back from an earlier start" in page.locator("#learn-ready").inner_text()
            assert re.search(r"(\d+) of \1 show-me results read back from", second.log()), second.log()[-2000:]
        assert page.locator(".toast-body.error").count() == 0, page.locator(".toast-body.error").all_inner_texts()
        assert not errors, errors
    finally:
        page.close()
        stop_app(second.proc)
