"""The calling thread's OpenMP workers handed back (kvviz/openmp.py): a thread that stopped computing holds none,
so the one thread that computes keeps libgomp's full-speed spin (see the module docstring)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from kvviz import openmp
from kvviz.engine.engine import Engine

needs_pools = pytest.mark.skipif(
    not openmp.available() or torch.get_num_threads() < 2,
    reason="no OpenMP pool to hand back: this torch is not built on GNU OpenMP (libgomp), or computes on one thread",
)


def native_threads() -> int:
    """OS threads that are not Python threads: OpenMP's workers (and whatever torch started at import)."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def compute() -> None:
    torch.ones(1 << 22).add_(1.0)  # an elementwise op over 4M numbers: one parallel region over every thread


@needs_pools
def test_a_thread_that_released_its_pool_holds_no_workers():
    seen = {}

    def work():
        compute()
        seen["with_pool"] = native_threads()
        seen["released"] = openmp.release()
        seen["after"] = native_threads()
        compute()  # the next parallel region builds a new pool: computing still works
        seen["again"] = native_threads()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    workers = torch.get_num_threads() - 1
    assert seen["released"] is True
    assert seen["after"] == seen["with_pool"] - workers
    assert seen["again"] == seen["with_pool"]


@needs_pools
def test_the_engine_hands_its_workers_back_when_idle(lm, monkeypatch):
    """The engine's thread releases its pool once its runs are done (counting native threads here would also
    count the other tests' threads starting and ending); the release itself is tested above."""
    calls, real = [], openmp.release

    def release() -> bool:
        calls.append((threading.current_thread().name, real()))
        return calls[-1][1]

    monkeypatch.setattr(openmp, "release", release)
    engine = Engine(lm)
    try:
        engine.submit("The KV cache", chat=False, max_new_tokens=3).result()
        assert wait_for(lambda: ("kvviz-engine", True) in calls)
        assert calls[0] == ("MainThread", True)  # submit: the caller hands its own workers back first
    finally:
        engine.close()
