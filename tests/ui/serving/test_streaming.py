"""The worker that runs a model job while a streaming handler reads its latest state at its own pace."""

from __future__ import annotations

import threading

import pytest

from kvviz.ui.serving.streaming import Background


def test_the_reader_sees_each_state_once_and_always_the_end():
    exits = []
    job = Background(lambda report: iter(range(1, 6)), on_exit=[lambda: exits.append("out")]).start()
    snaps = list(job.snapshots(interval=3600.0))  # an interval this long: only the first change and the end
    assert snaps[-1].done and snaps[-1].item == 5 and snaps[-1].items == 5
    assert all(not s.done for s in snaps[:-1]) and len(snaps) <= 2
    assert exits == ["out"] and job.join(5)


def test_progress_between_items_reaches_the_reader_while_the_job_works():
    release = threading.Event()

    def work(report):
        report(("prefill", 512, 2048))
        release.wait(30)
        yield "first step"

    job = Background(work).start()
    reader = job.snapshots(interval=0.0)
    first = next(reader)
    assert first.item is None and first.progress == ("prefill", 512, 2048) and not first.done
    release.set()
    rest = list(reader)
    assert rest[-1].item == "first step" and rest[-1].done


def test_the_mark_is_taken_when_the_item_is_yielded():
    seen_by_worker = threading.Event()
    read = threading.Event()

    def work(report):
        tokens = ["a"]
        yield tokens
        seen_by_worker.set()
        read.wait(30)
        tokens.append("b")  # the job keeps growing the item it already handed out
        yield tokens

    job = Background(work, mark=len).start()
    reader = job.snapshots(interval=0.0)
    snap = next(reader)
    assert snap.mark == 1 and snap.item[: snap.mark] == ["a"]
    read.set()
    assert list(reader)[-1].mark == 2


def test_the_jobs_error_is_raised_in_the_reader_after_its_clean_up():
    events = []

    def work(report):
        try:
            yield 1
            raise ValueError("the model failed")
        finally:
            events.append("generator closed")

    job = Background(work, on_exit=[lambda: events.append("ticket released")]).start()
    with pytest.raises(ValueError, match="the model failed"):
        list(job.snapshots(interval=0.0))
    assert events == ["generator closed", "ticket released"]


def test_cancel_stops_the_job_at_its_next_step_and_runs_its_clean_up():
    events = []
    steps = []

    def work(report):
        try:
            while True:
                steps.append(len(steps))
                yield len(steps)
        finally:
            events.append("generator closed")

    job = Background(work, on_exit=[lambda: events.append("ticket released")])
    assert not job.started
    job.start()
    reader = job.snapshots(interval=0.0)
    next(reader)
    reader.close()  # the page went away
    job.cancel()
    assert job.join(30) and job.cancelled
    assert events == ["generator closed", "ticket released"]
