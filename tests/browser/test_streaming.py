"""A long run in a real browser: the status line moves while the model writes, and every token ends as a chip.

Runs against ``inprocess_app`` (its limit allows 200 new tokens; the shared server's does not).
"""

from __future__ import annotations

import re

from kvviz.capture.model_io import encode_prompt
from tests.browser.form import set_form

PROMPT = "Once upon a time"  # greedy, without the chat template, it does not stop before 200 tokens
N_NEW = 200
# every text the status line shows, in order, kept in the page
WATCH_STATUS = """() => {
  window.__statusLog = [];
  const el = document.querySelector('#gen-status');
  new MutationObserver(() => window.__statusLog.push(el.innerText.trim()))
    .observe(el, {subtree: true, childList: true, characterData: true});
}"""


# the cache-growth chart every 250 ms: its plotly element (numbered as first seen) and its number of points
WATCH_GROWTH = """() => {
  window.__growthLog = [];
  let seen = 0;
  setInterval(() => {
    const chart = document.querySelector('#cache-growth .js-plotly-plot');
    if (!chart || !chart.data) return;
    chart.__kvvizSeen ??= ++seen;
    window.__growthLog.push([chart.__kvvizSeen, chart.data[0].x.length]);
  }, 250);
}"""


def test_a_200_token_run_streams_and_ends_with_every_chip(browser_context, inprocess_app, screenshot):
    tab = browser_context.new_page()
    try:
        tab.set_default_timeout(30_000)
        tab.goto(inprocess_app.url, wait_until="load")
        tab.wait_for_selector("#generate-btn")
        set_form(tab, PROMPT, N_NEW)
        tab.evaluate(WATCH_STATUS)
        # the page opens on a chart (blank, or the opening example's), seen before the click as element 1
        tab.locator("#cache-growth .js-plotly-plot .main-svg").first.wait_for()
        tab.evaluate(WATCH_GROWTH)
        tab.wait_for_function("() => window.__growthLog.length > 0")
        tab.locator("#generate-btn").click()
        tab.locator("#gen-status").get_by_text(re.compile(r"^Done")).wait_for(timeout=600_000)

        log = tab.evaluate("() => window.__statusLog")
        counts = [int(m.group(1)) for text in log if (m := re.match(r"Generating: (\d+) tokens", text))]
        assert len(set(counts)) >= 2, f"the status moved less than twice while generating: {log}"
        # the last token's step may be shown before the check starts ("Generating: 200 tokens"), never more
        assert counts == sorted(counts) and counts[0] < N_NEW and counts[-1] <= N_NEW
        assert re.match(rf"Done: {N_NEW} tokens", tab.locator("#gen-status").inner_text().strip())

        n_prompt = len(encode_prompt(inprocess_app.ctx.lm, PROMPT, chat=False))
        assert tab.locator("#token-stream .token-container").count() == n_prompt + N_NEW
        assert tab.locator("#cache-growth .js-plotly-plot .scatterlayer .trace").count() >= 1
        # the chart grew while the run streamed, redrawn in place: one plotly element showed several lengths
        # (a gr.Plot given each new figure builds a new element every time), and the run ends with every step
        # the last chart comes with "Done" as the plot's value: drawn a moment after the status says so
        tab.wait_for_function(f"() => window.__growthLog.at(-1)[1] === {N_NEW}", timeout=10_000)
        growth = tab.evaluate("() => window.__growthLog")
        lengths: dict[int, set[int]] = {}
        for element, n in growth:
            lengths.setdefault(element, set()).add(n)
        assert max(len(ns) for ns in lengths.values()) >= 2, f"no chart was redrawn in place: {growth}"
        # the run's first charts too: the chart the page opened on showed the run while it streamed
        assert any(0 < n < N_NEW for n in lengths[1]), f"the run's charts were built anew, not redrawn: {growth}"
        assert growth[-1][1] == N_NEW, growth[-5:]
        assert "equals" in tab.locator("#equivalence").inner_text()
        screenshot(tab, "streamed_200_tokens")
    finally:
        tab.close()
