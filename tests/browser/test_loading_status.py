"""The page keeps no loading status for what only hidden-progress events write (kvviz/ui/page/quiet_events.py).

Gradio's page keeps a loading status for every progress target any event has had, and hands each of them a new
one on every message of a streamed run: before, ~36 components once the page had opened and ~64 after one
Generate, each redrawn about twice a second while the run streamed, drawing nothing. The page's registry is
read by serving Gradio's ``Blocks`` script with one line added that keeps a reference to it.
"""

from __future__ import annotations

import re

from tests.browser.form import generate

EXPOSE = "window.__kvvizLoading=this.loading_stati;"
HOOK = "async update_loading_stati_state(){"


def test_the_page_keeps_no_loading_status_for_the_generate_tab(browser_context, app_server):
    tab = browser_context.new_page()
    hooked = []

    def expose(route):
        response = route.fetch()
        body = response.text()
        hooked.append(HOOK in body)
        route.fulfill(response=response, body=body.replace(HOOK, HOOK + EXPOSE, 1))

    try:
        tab.set_default_timeout(30_000)
        tab.route(re.compile(r".*/Blocks-[^/]*\.js$"), expose)
        tab.goto(app_server, wait_until="load")
        tab.wait_for_selector("#generate-btn")
        assert hooked == [True], "Gradio's Blocks script no longer has the method this test hooks (a new Gradio?)"
        tab.wait_for_function("() => !!window.__kvvizLoading")  # the page's own load events have run
        opened = tab.evaluate("() => Object.keys(window.__kvvizLoading.current).length")
        assert opened == 0, f"the page keeps {opened} loading statuses once open (its load events show no progress)"
        generate(tab, "The capital of France is", 8, timeout_ms=120_000)
        kept = tab.evaluate(
            """() => {
              const ids = Object.keys(window.__kvvizLoading.current).map(Number);
              const elem = Object.fromEntries(window.gradio_config.components.map((c) => [c.id, c.props.elem_id]));
              return {elem_ids: ids.map((id) => elem[id] || String(id))};
            }"""
        )
        streamed = {"gen-status", "token-stream", "answer", "cache-growth", "memory-gauge", "gen-redraw", "waste"}
        # (what is left belongs to the events after a run that do show progress: the other tabs' views)
        assert not streamed & set(kept["elem_ids"]), kept
    finally:
        tab.close()
