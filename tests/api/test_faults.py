"""Faults mid-generation end that job cleanly: an exception inside a step frees its cache and the next request works.

Runs against the in-process app (``inprocess_app``) so the test can see inside: whether the capture
attention function is still installed and whether the failed job's KV cache is still alive.
Stop presses and client disconnects are in tests/browser/test_faults_browser.py.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from transformers import DynamicCache

from kvviz.capture.attention_fn import is_installed
from kvviz.capture.loop import capture

PROMPT = "The capital of France is"


@pytest.fixture
def faulty_capture(inprocess_app, monkeypatch):
    """Make the engine's runs raise inside step 2; returns weak references to the caches they built."""
    engine = inprocess_app.ctx.engine
    real = engine.submit
    caches: list[weakref.ref] = []

    def cache_factory(lm):
        cache = DynamicCache(config=lm.config)  # what capture_iter builds by default
        caches.append(weakref.ref(cache))
        return cache

    def boom(cache, recorder, step):
        if step == 2:
            raise RuntimeError("injected fault in step 2")

    def faulty(*args, **kwargs):
        return real(*args, cache_factory=cache_factory, after_step=boom, **kwargs)

    monkeypatch.setattr(engine, "submit", faulty)
    return caches


def test_exception_inside_a_step_ends_the_job_cleanly(inprocess_app, faulty_capture, monkeypatch):
    client = Client(inprocess_app.url, verbose=False)
    with pytest.raises(AppError, match=r"Generation failed: RuntimeError: injected fault in step 2"):
        client.predict(PROMPT, 8, False, 0.0, 1.0, 0, api_name="/generate")
    lm = inprocess_app.ctx.lm
    assert not is_installed(lm.model), "the capture attention function outlived the failed job"
    assert inprocess_app.ctx.engine.snapshot()["running"] == 0
    gc.collect()
    assert faulty_capture and all(ref() is None for ref in faulty_capture), "the failed job's KV cache is still alive"

    monkeypatch.undo()  # the next request, with no fault, works and matches a direct run
    out = client.predict(PROMPT, 4, False, 0.0, 1.0, 0, api_name="/generate")
    trace = capture(lm, PROMPT, chat=False, max_new_tokens=4)
    assert out["text"] == trace.text and out["generated_tokens"] == trace.n_generated
