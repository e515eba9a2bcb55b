"""The page's main journeys on the app served as on ZeroGPU (the stand-in ``spaces`` from tests/zerogpu): Generate,
Eviction and a Learn show-me each finish, every model job in a GPU call of its own, none outside one."""

from __future__ import annotations

import re

import pytest

from kvviz.lessons.objectives import OBJECTIVES
from tests.browser.test_learn_journey import open_learn, show_me
from tests.server import stop_app
from tests.zerogpu.test_served import calls, start_zero_app


@pytest.fixture(scope="module")
def zero_page(browser_context, tmp_path_factory):
    app, log = start_zero_app(tmp_path_factory.mktemp("zerogpu-page"))
    tab = browser_context.new_page()
    tab.set_default_timeout(30_000)
    try:
        tab.goto(app.url, wait_until="load")
        tab.wait_for_selector("#generate-btn")
        yield tab, log
    finally:
        tab.close()
        stop_app(app.proc)


def test_generate_then_eviction_then_a_show_me_under_zerogpu(zero_page):
    page, log = zero_page
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    page.locator("#prompt textarea").fill("What is the capital of France?")
    num = page.get_by_label("number input for Max new tokens")
    num.fill("8")
    num.press("Enter")
    page.locator("#generate-btn").click()
    page.locator("#gen-status").get_by_text(re.compile(r"^Done")).wait_for(timeout=120_000)
    assert "Paris" in page.locator("#answer textarea").input_value()
    page.locator("#cache-growth .js-plotly-plot").wait_for(timeout=30_000)
    generated = len([c for c in calls(log) if "duration" in c])
    assert generated >= 1

    page.get_by_role("tab", name="Eviction").click()
    page.locator("#evict-prompt textarea").fill("The code for the staff room is 5512. Visitors enjoy the garden.")
    page.locator("#evict-policy input").click()
    page.get_by_role("option", name="StreamingLLM (sinks + recent)").click()
    for elem_id, value in (("evict-budget", "12"), ("evict-max-new", "4")):
        box = page.locator(f"#{elem_id} input[type=number]").first
        box.fill(value)
        box.press("Enter")
    page.locator("#evict-run").click()
    page.locator("#evict-status").get_by_text(re.compile(r"n_kept = 12")).wait_for(timeout=120_000)

    obj = OBJECTIVES[0]
    open_learn(page, f"{obj.number} {obj.title}")
    show_me(page, f"showme-{obj.number}-1", obj.show_me[0])

    assert len([c for c in calls(log) if "duration" in c]) > generated  # the later jobs asked for leases too
    assert not [c for c in calls(log) if "outside" in c], "a model forward ran outside a GPU call"
    assert page.locator(".toast-body.error").count() == 0, "an error toast is shown"
    assert not errors, f"JavaScript errors in the page: {errors}"
