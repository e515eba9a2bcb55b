"""Many users in real browsers: Stop, bad input after a good run, a closed tab mid-generation, session cleanup.

Runs against ``inprocess_app`` (the app served from this test process, heartbeat 1 s, session grace
0 s) so the tests can check what the server still holds after each fault.
"""

from __future__ import annotations

import gc
import re
import time
import weakref

import pytest
from gradio_client import Client
from transformers import DynamicCache

from kvviz.capture.attention_fn import is_installed
from kvviz.capture.trace import Trace
from kvviz.ui.serving.gradio_adapter import state_values

LONG_PROMPT = "Write a long story about a dragon who learns to bake bread."
# long enough that Stop and a closed tab always arrive mid-run, even when the test process (which also
# serves the app and runs the model) is slow to drive the browser
LONG_RUN = 256


def wait_until(check, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for: {what}")


@pytest.fixture
def open_page(browser_context):
    """``open_page(url)`` opens a new tab on the app; every tab still open is closed after the test,
    so a failed test never leaves a session running into the next one."""
    opened = []

    def open_(url: str):
        tab = browser_context.new_page()
        opened.append(tab)
        tab.set_default_timeout(30_000)
        tab.goto(url, wait_until="load")
        tab.wait_for_selector("#generate-btn")
        return tab

    yield open_
    for tab in opened:
        if not tab.is_closed():
            tab.close()


def start_generation(tab, prompt: str, new_tokens: int) -> None:
    tab.locator("#prompt textarea").fill(prompt)
    box = tab.get_by_label("number input for Max new tokens")
    box.fill(str(new_tokens))
    box.press("Enter")
    tab.locator("#generate-btn").click()


def sessions_with_traces(demo) -> int:
    """How many sessions the server still holds a Trace for (in gr.State)."""
    return sum(any(isinstance(v, Trace) for v in values) for values in state_values(demo).values())


@pytest.fixture
def tracked_capture(inprocess_app, monkeypatch):
    """Wrap the engine's submit: keep each run's handle and weak-reference its cache."""
    engine = inprocess_app.ctx.engine
    real = engine.submit
    record: dict = {"handles": [], "caches": []}

    def cache_factory(lm):
        cache = DynamicCache(config=lm.config)
        record["caches"].append(weakref.ref(cache))
        return cache

    def tracked(*args, **kwargs):
        handle = real(*args, cache_factory=cache_factory, **kwargs)
        record["handles"].append(handle)
        return handle

    monkeypatch.setattr(engine, "submit", tracked)
    return record


def test_queue_stop_bad_input_and_closing_free_the_session(open_page, inprocess_app, screenshot):
    ctx, demo = inprocess_app.ctx, inprocess_app.demo
    tab, other = open_page(inprocess_app.url), open_page(inprocess_app.url)
    start_generation(tab, LONG_PROMPT, LONG_RUN)
    status = tab.locator("#gen-status")
    status.get_by_text(re.compile(r"^Generating")).wait_for(timeout=90_000)

    # a second student's run joins the first one's batch: it finishes while the long run still generates
    start_generation(other, "The capital of France is", 2)
    other.locator("#gen-status").get_by_text(re.compile(r"^Done")).wait_for(timeout=90_000)
    assert status.inner_text().startswith("Generating")
    screenshot(other, "batched_beside_a_long_run")
    other.close()

    # Stop ends the first job early
    tab.bring_to_front()  # the first student is back on their own page
    tab.locator("#stop-btn").click(timeout=60_000)
    status.get_by_text(re.compile(r"stop: stopped")).wait_for(
        timeout=180_000
    )  # the stopped run still verifies and exports
    n_done = int(re.search(r"Done: (\d+) tokens", status.inner_text()).group(1))
    assert 1 <= n_done < LONG_RUN
    answer = tab.locator("#answer textarea").input_value()
    assert answer.strip()
    wait_until(lambda: not ctx.stop_flags, what="Stop flags to be dropped after the jobs")
    assert not is_installed(ctx.lm.model)
    wait_until(lambda: len(ctx.files.sessions()) == 1, what="only this session's exports to remain")

    # bad input after a good run: a clear message, and the earlier results are cleared, so they never sit
    # under settings that were refused (the session's trace stays for the other tabs)
    tab.locator("#prompt textarea").fill("   ")
    tab.locator("#generate-btn").click()
    toast = tab.locator(".toast-body.error")
    toast.first.wait_for(timeout=30_000)
    assert "prompt is empty" in toast.first.inner_text()
    wait_until(lambda: tab.locator("#answer textarea").input_value() == "", what="the refused run's results cleared")
    screenshot(tab, "bad_input_keeps_results")
    assert sessions_with_traces(demo) >= 1

    tab.close()  # the session ends: flags, files and (after the 0 s grace) its trace are freed
    wait_until(lambda: not ctx.files.sessions(), what="the session's files to be deleted")
    wait_until(lambda: sessions_with_traces(demo) == 0, what="the session's trace to be dropped")
    assert not ctx.stop_flags


def test_closing_the_tab_mid_generation_ends_the_job_and_frees_its_cache(open_page, inprocess_app, tracked_capture):
    ctx = inprocess_app.ctx
    tab = open_page(inprocess_app.url)
    start_generation(tab, LONG_PROMPT, LONG_RUN)
    tab.locator("#gen-status").get_by_text(re.compile(r"^Generating")).wait_for(timeout=90_000)
    tab.close()
    handles = tracked_capture["handles"]
    wait_until(lambda: handles and handles[0].run.finished, what="the run to end after the tab went away")
    assert len(handles[0].trace.steps) < LONG_RUN, "the run went to the end although nobody was watching"
    gc.collect()
    assert tracked_capture["caches"] and all(r() is None for r in tracked_capture["caches"]), "its cache is alive"
    assert not is_installed(ctx.lm.model)
    wait_until(lambda: not ctx.stop_flags and not ctx.files.sessions(), what="the session to be forgotten")

    out = Client(inprocess_app.url, verbose=False).predict(
        "The capital of France is", 3, False, 0.0, 1.0, 0, api_name="/generate"
    )
    assert out["generated_tokens"] == 3 and "Paris" in out["text"]
