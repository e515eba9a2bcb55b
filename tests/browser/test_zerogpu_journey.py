"""The page's main journeys on the app served as on ZeroGPU (the real ``spaces`` package against the fake device API
of tests/zerogpu, with its CPU shim): Generate, Eviction and a Learn show-me each finish, every model job in a GPU
call of its own, no model forward outside one."""

from __future__ import annotations

import re

import pytest

from kvviz.lessons.objectives import OBJECTIVES
from tests.browser.test_learn_journey import open_learn, show_me
from tests.server import start_app, stop_app
from tests.zerogpu.conftest import zero_env
from tests.zerogpu.device_api import DeviceAPI


@pytest.fixture(scope="module")
def zero_page(browser_context, tmp_path_factory):
    api = DeviceAPI().start()
    base = tmp_path_factory.mktemp("zerogpu-page")
    log = base / "outside.jsonl"  # the CPU shim logs every model forward outside a GPU call here
    app = start_app(base, extra_env=zero_env(api, FAKE_ZEROGPU_LOG=str(log)))
    tab = browser_context.new_page()
    tab.set_default_timeout(30_000)
    try:
        tab.goto(app.url, wait_until="load")
        tab.wait_for_selector("#generate-btn")
        yield tab, api, log
    finally:
        tab.close()
        stop_app(app.proc)
        api.stop()


def test_generate_then_eviction_then_a_show_me_under_zerogpu(zero_page):
    page, api, log = zero_page
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
    generated = len(api.of("/schedule"))
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

    assert len(api.of("/schedule")) > generated  # the later jobs asked for GPU calls too
    assert not (log.exists() and log.read_text().strip()), "a model forward ran outside a GPU call"
    assert page.locator(".toast-body.error").count() == 0, "an error toast is shown"
    assert not errors, f"JavaScript errors in the page: {errors}"
