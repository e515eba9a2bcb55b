"""One run's failure ends that run only, and a stopped run ends mid-prefill: the engine serving a room."""

from __future__ import annotations

import threading

import pytest

from kvviz.capture.model_io import Sampling
from kvviz.engine.engine import Engine
from kvviz.engine.handle import wait_all
from tests.engine.test_engine import solo

pytestmark = pytest.mark.slow

NEIGHBOURS = [("Name three colours.", 6), ("What is the capital of France?", 5)]


def _batched_together(engine: Engine, submit) -> list:
    """Submit while the idle engine gathers, so every run decodes in the same steps."""
    handles = submit()
    assert wait_all(handles, 600)
    assert engine.counters["max_batch_seen"] == len(handles)
    return handles


@pytest.mark.parametrize("temperature", [1e-38, 5e-324])
def test_a_run_whose_sampling_fails_ends_alone(lm, temperature):
    # the library accepts any temperature ≥ 0; at these, logits / T is inf and sampling raises
    engine = Engine(lm, prefix_cache_bytes=0, gather_s=0.5, gather_max_s=2.0)
    bad = Sampling(temperature=temperature, top_p=1.0, seed=0)

    def submit():
        good = [engine.submit(p, chat=True, max_new_tokens=n) for p, n in NEIGHBOURS]
        return [*good, engine.submit("Hello!", chat=True, max_new_tokens=4, sampling=bad)]

    *good, failed = _batched_together(engine, submit)
    with pytest.raises(RuntimeError, match="probability tensor"):
        failed.result()
    for h, (p, n) in zip(good, NEIGHBOURS):
        assert h.result().token_ids == solo(lm, p, chat=True, max_new_tokens=n).trace.token_ids
    assert engine.snapshot()["running"] == 0


def test_a_step_hook_that_raises_ends_only_its_own_run(lm):
    engine = Engine(lm, prefix_cache_bytes=0, gather_s=0.5, gather_max_s=2.0)

    def boom(cache, recorder, step):
        if step == 2:
            raise RuntimeError("injected fault in step 2")

    def submit():
        good = [engine.submit(p, chat=True, max_new_tokens=n) for p, n in NEIGHBOURS]
        return [*good, engine.submit("Hello!", chat=True, max_new_tokens=6, after_step=boom)]

    *good, failed = _batched_together(engine, submit)
    with pytest.raises(RuntimeError, match="injected fault"):
        failed.result()
    for h, (p, n) in zip(good, NEIGHBOURS):
        assert h.result().token_ids == solo(lm, p, chat=True, max_new_tokens=n).trace.token_ids


def test_a_run_stopped_during_its_prefill_ends_before_the_prefill_does(lm):
    # a long prompt fed a few tokens per step: a time budget that runs out mid-prefill ends the run there
    engine = Engine(lm, prefix_cache_bytes=0, token_budget=16)
    stop = threading.Event()
    prompt = " ".join(f"word{i}" for i in range(200))
    handle = engine.submit(prompt, chat=False, max_new_tokens=8, cancel=stop.is_set)
    seen = []
    trace = list(handle.stream(report=lambda p: seen.append(p) or (p.done >= 32 and stop.set())))[-1]
    assert trace.stop_reason == "stopped"
    assert trace.n_generated == 0
    assert seen[-1].phase == "prefill" and seen[-1].done < trace.n_prompt
