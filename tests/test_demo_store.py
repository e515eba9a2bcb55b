"""The shared store of ready results: computed once, waited for (never twice), freed again on failure."""

from __future__ import annotations

import threading
import time

import pytest

from kvviz.demo_store import DemoStore


def slow(calls: list, seconds: float = 0.3, value: object = "result"):
    def compute(report, should_stop):
        calls.append(1)
        report(0.5, "half")
        time.sleep(seconds)
        return value

    return compute


def test_a_running_result_is_waited_for_not_computed_twice():
    store, calls = DemoStore(), []
    entry = store.plan("k", "demo", slow(calls))
    claimed, mine = store.claim("k")
    assert mine and claimed is entry
    worker = threading.Thread(target=store.run, args=(entry, "start-up"))
    worker.start()
    again, mine2 = store.claim("k")
    assert again is entry and not mine2  # a second request gets the same entry to wait on
    assert entry.wait(5) and entry.value == "result" and entry.source == "start-up"
    worker.join()
    assert calls == [1] and store.counts() == {"pending": 0, "running": 0, "done": 1}
    assert entry.seconds is not None and entry.seconds >= 0.3 and entry.fraction == 1.0


def test_unplanned_keys_are_never_stored():
    store = DemoStore()
    assert store.claim("nope") == (None, False)
    assert store.entries() == []


def test_a_failed_or_stopped_computation_frees_the_key():
    store = DemoStore()

    def boom(report, should_stop):
        raise RuntimeError("no")

    entry = store.plan("k", "demo", boom)
    store.claim("k")
    with pytest.raises(RuntimeError):
        store.run(entry, "a request")
    assert entry.state == "pending" and isinstance(entry.error, RuntimeError)
    entry2 = store.plan("s", "demo", slow([], 0.0))
    store.claim("s")
    store.run(entry2, "a request", should_stop=lambda: True)  # cut short: not kept
    assert entry2.state == "pending" and store.claim("s")[1]


def test_plan_keeps_the_first_and_put_first_orders_the_work():
    store = DemoStore()
    a = store.plan("a", "A", slow([]))
    assert store.plan("a", "again", slow([])) is a
    store.plan("b", "B", slow([]))
    store.plan("c", "C", slow([]))
    store.put_first(["c", "missing", "a"])
    assert [e.key for e in store.entries()] == ["c", "a", "b"]
