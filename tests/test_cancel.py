"""One cancellation token per run: conditions latch it with their reason, and a worker stops on its own only
when nobody reads it any more."""

from __future__ import annotations

import threading

from kvviz.cancel import GONE, STOPPED, TIME_BUDGET, Cancel
from kvviz.ui.serving.streaming import Background


def test_a_watched_condition_cancels_once_with_its_reason():
    pressed, expired = threading.Event(), threading.Event()
    token = Cancel((pressed.is_set, STOPPED), (expired.is_set, TIME_BUDGET))
    assert not token() and token.reason is None
    expired.set()
    assert token() and token.reason == TIME_BUDGET
    pressed.set()
    expired.clear()
    assert token.cancelled and token.reason == TIME_BUDGET, "once set it stays set, and the first reason stays"


def test_of_takes_a_token_a_callable_or_nothing():
    token = Cancel()
    assert Cancel.of(token) is token
    flag = threading.Event()
    watching = Cancel.of(flag.is_set)
    assert not watching()
    flag.set()
    assert watching() and watching.reason == STOPPED
    assert not Cancel.of(None)()


def test_a_worker_hands_over_its_last_item_after_stop_and_stops_when_the_page_goes():
    token = Cancel()
    release = threading.Event()

    def work(report):
        for i in range(1000):
            if i == 3:
                token.cancel()  # Stop: the work ends itself and its last item is still read
            if token() and i >= 5:
                yield "last"
                return
            yield i

    job = Background(work, cancel=token).start()
    *_, end = job.snapshots(0.01)
    assert end.done and end.item == "last" and not job.cancelled

    gone = Cancel()

    def endless(report):
        while True:
            release.wait(0.01)
            yield 1

    reader = Background(endless, cancel=gone).start()
    reader.cancel()
    assert reader.join(30) and reader.cancelled and gone.reason == GONE and gone()
