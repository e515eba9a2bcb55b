"""Start-up examples: computed in the background through the gate, after the users' jobs, each once."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from kvviz.admission import Gate
from kvviz.demo_store import DemoStore
from kvviz.ui.serving import precompute


def fake_ctx() -> SimpleNamespace:
    return SimpleNamespace(
        store=DemoStore(),
        jobs=SimpleNamespace(gate=Gate(slots=1), room=Gate(slots=4)),
        settings=SimpleNamespace(precompute=True),
    )


def test_the_plan_waits_for_user_jobs_and_computes_each_result_once():
    ctx, order = fake_ctx(), []
    for key in ("a", "b"):
        ctx.store.plan(key, key, lambda report, stop, key=key: order.append(key) or key.upper())
    user = ctx.jobs.gate.admit("someone", "generation")  # a user job is running
    thread = precompute.start(ctx)
    time.sleep(3 * precompute.IDLE_POLL_S)
    assert order == [] and ctx.store.counts()["done"] == 0  # it waits while a user job holds the gate
    user.release()
    thread.join(10)
    assert order == ["a", "b"] and [e.value for e in ctx.store.entries()] == ["A", "B"]
    assert all(e.source == "start-up" for e in ctx.store.entries())
    assert ctx.jobs.gate.snapshot() == {"running": 0, "waiting": 0, "sessions": 0}
    assert "all 2 show-me examples" in precompute.readiness(ctx)


def test_the_plan_waits_for_generate_runs_too():
    ctx, order = fake_ctx(), []
    ctx.store.plan("a", "a", lambda report, stop: order.append("a") or "A")
    run = ctx.jobs.room.admit("student", "generation")  # a Generate run, decoded by the engine
    thread = precompute.start(ctx)
    time.sleep(3 * precompute.IDLE_POLL_S)
    assert order == []
    run.release()
    thread.join(10)
    assert order == ["a"]


def test_a_request_waits_for_the_running_computation_and_sees_its_progress():
    ctx, calls, started = fake_ctx(), [], threading.Event()

    def compute(report, stop):
        calls.append(1)
        report(0.5, "half way")
        started.set()
        time.sleep(0.5)
        return "ready"

    entry = ctx.store.plan("k", "the demo", compute)
    thread = precompute.start(ctx)
    started.wait(5)
    seen: list[tuple[float, str]] = []
    assert precompute.wait_for(entry, lambda f, d: seen.append((f, d)), poll=0.05)
    thread.join(5)
    assert calls == [1] and entry.value == "ready"
    assert seen and seen[0] == (0.5, "Being prepared at start-up (the demo): half way")
    assert precompute.origin(entry).startswith("computed at start-up (")


def test_off_means_no_thread():
    ctx = fake_ctx()
    ctx.settings.precompute = False
    ctx.store.plan("k", "k", lambda report, stop: 1)
    assert precompute.start(ctx) is None
    assert "Start-up computing is off" in precompute.readiness(ctx)


def test_views_of_a_shared_trace_are_drawn_once_and_others_every_time():
    ctx, calls = fake_ctx(), []
    ctx.trace_state = object()

    def view(trace, layer):
        calls.append((trace, layer))
        return f"{trace}@{layer}"

    listener = precompute.memo_listener(ctx, view)
    ctx.listeners = [(listener, [ctx.trace_state, SimpleNamespace(value=3)], [])]
    stored, own = "stored-trace", "own-trace"
    precompute.share_trace(ctx, stored)  # drawn once with the view's opening setting
    assert calls == [(stored, 3)]
    assert listener(stored, 3) == "stored-trace@3" and calls == [(stored, 3)]  # reused
    assert listener(stored, 5) == "stored-trace@5" and len(calls) == 2  # another setting: drawn
    listener(own, 3)
    listener(own, 3)
    assert calls[-2:] == [(own, 3), (own, 3)]  # a session's own trace is never kept


def test_a_view_drawn_hands_its_threads_openmp_workers_back(monkeypatch):
    """Views draw in Gradio's worker threads, which live on: a pool kept there slows the engine (kvviz.openmp)."""
    from kvviz import openmp

    ctx, released = fake_ctx(), []
    monkeypatch.setattr(openmp, "release", lambda: released.append(True) or True)

    def failing(trace):
        raise ValueError("no view")

    listener = precompute.memo_listener(ctx, lambda trace: f"{trace}!")
    assert listener("own-trace") == "own-trace!" and released == [True]
    with pytest.raises(ValueError):
        precompute.memo_listener(ctx, failing)("own-trace")
    assert released == [True, True]


def test_warm_runs_the_generate_example_once_unless_turned_off(caplog):
    from kvviz.examples import GENERATE_EXAMPLE, examples

    calls = []

    def warm(prompt, chat):
        calls.append((prompt, chat))
        return SimpleNamespace(n_prompt=37)

    ctx = SimpleNamespace(settings=SimpleNamespace(warm=False), engine=SimpleNamespace(warm=warm))
    precompute.warm(ctx)
    assert calls == []
    ctx.settings.warm = True
    precompute.warm(ctx)
    assert calls == [examples()[GENERATE_EXAMPLE]]

    def broken(prompt, chat):
        raise RuntimeError("no model today")

    ctx.engine.warm = broken
    with caplog.at_level("ERROR", logger="kvviz"):
        precompute.warm(ctx)  # logged; the server still starts
    assert "warm-up failed" in caplog.text
