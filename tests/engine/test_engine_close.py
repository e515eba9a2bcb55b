"""Engine.close: the server stopping ends the engine's thread after its step; its runs end with an error,
later submits are refused (a thread left inside a forward at exit aborts the process)."""

from __future__ import annotations

import pytest

from kvviz.engine.engine import Engine

pytestmark = pytest.mark.slow


def test_close_ends_the_thread_and_every_run_and_refuses_new_ones(lm):
    engine = Engine(lm, max_batch=1, prefix_cache_bytes=0)
    running = engine.submit("Tell me a long story about a cat.", chat=True, max_new_tokens=200)
    waiting = engine.submit("Name three colours.", chat=True, max_new_tokens=200)  # no room: it waits
    next(iter(running.stream()))  # decoding in the engine's thread
    assert engine.close(timeout=30)
    assert not engine._thread.is_alive()
    for handle in (running, waiting):
        assert handle.run.finished
        with pytest.raises(RuntimeError, match="shutting down"):
            handle.result()
    assert len(running.trace.steps) < 200
    with pytest.raises(RuntimeError, match="shutting down"):
        engine.submit("Name three fruits.", max_new_tokens=2)


def test_closing_an_engine_that_never_ran_is_immediate(lm):
    assert Engine(lm, prefix_cache_bytes=0).close(timeout=0)
