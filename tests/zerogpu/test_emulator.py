"""The ZeroGPU stand-in behaves like ZeroGPU's process model: a forked worker per call, results pickled back,
nothing in memory survives, the main process's threads are absent, durations asked per call."""

from __future__ import annotations

import json
import os
import queue
import threading

import pytest

from tests.zerogpu import spaces  # the stand-in, never importable as ``spaces`` here (the app would wrap its handlers)

COUNTER = {"n": 0}


@spaces.GPU
def bump() -> tuple[int, int, bool]:
    COUNTER["n"] += 1
    return COUNTER["n"], os.getpid(), spaces.held()


@spaces.GPU(duration=lambda n: 2 * n)
def count_to(n: int):
    for i in range(n):
        yield i, spaces.held()


@spaces.GPU
def fail() -> None:
    raise ValueError("bad input inside the worker")


def test_a_call_runs_in_a_forked_worker_whose_changes_are_lost():
    value, pid, held = bump()
    assert (value, held) == (1, True)
    assert pid != os.getpid()
    assert COUNTER["n"] == 0 and not spaces.held()
    assert bump()[0] == 1  # the next call starts again from the main process's memory


def test_each_yielded_item_comes_back_in_order():
    assert list(count_to(4)) == [(0, True), (1, True), (2, True), (3, True)]


def test_a_failure_in_the_worker_is_raised_in_the_caller():
    with pytest.raises(ValueError, match="bad input inside the worker"):
        fail()


def test_a_thread_of_the_main_process_does_not_exist_in_the_worker():
    """What a stepping engine thread meets on ZeroGPU: the job submitted from the worker is never served."""
    jobs: queue.Queue = queue.Queue()

    def serve() -> None:
        while True:
            reply = jobs.get()
            reply.put("served")

    threading.Thread(target=serve, daemon=True).start()

    def submit() -> str:
        reply: queue.Queue = queue.Queue()
        jobs.put(reply)
        try:
            return reply.get(timeout=1.0)
        except queue.Empty:
            return "never served"

    assert submit() == "served"
    assert spaces.GPU(submit)() == "never served"


def test_the_requested_duration_is_computed_per_call_and_checked_against_the_quota(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_ZEROGPU_LOG", str(log))
    list(count_to(3))
    monkeypatch.setenv("FAKE_ZEROGPU_QUOTA_S", "5")
    with pytest.raises(spaces.QuotaExceeded, match="exceeded your GPU quota"):
        list(count_to(30))
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["duration"] for c in calls] == [6.0]
