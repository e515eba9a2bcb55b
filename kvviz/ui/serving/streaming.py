"""A model job in a worker thread, read by a streaming handler at the page's own pace.

The job (a generator, e.g. ``capture_iter``) runs flat out in its thread and leaves its latest item
and progress report here; the handler wakes every ``interval`` seconds, renders that state once and
yields it. Rendering and the browser's redraws then never hold up decoding, and a long run costs no
more per update than a short one. ``snapshots`` yields nothing twice and always yields the end; the
job's exception is raised in the handler. Closing the handler early (Stop is separate: a page that
went away) cancels the job at its next step, and the ``on_exit`` callbacks (the gate's ticket) run in
the worker once the job has really stopped, before its end is seen, so nothing waits for the model in
the server's event loop and the next job never overlaps this one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kvviz.cancel import GONE, Cancel

T = TypeVar("T")


@dataclass(frozen=True)
class Snapshot(Generic[T]):
    """The job's state at one moment: its latest item, the ``mark`` taken of it when it was yielded
    (a consistent cut of an item the job keeps growing), the latest progress report, and whether it ended."""

    item: T | None
    mark: Any
    progress: Any
    items: int  # items yielded so far
    done: bool


class Background(Generic[T]):
    """Runs ``work(report)`` — an iterable; ``report(x)`` records progress — in a daemon thread.

    ``mark(item)`` runs in the worker right after each item is yielded (keep it O(1)); its result
    travels with the item, so the reader can take the item as it was at that moment. ``on_exit``
    callbacks run in the worker when the job has ended, however it ended.
    """

    def __init__(
        self,
        work: Callable[[Callable[[Any], None]], Iterable[T]],
        mark: Callable[[T], Any] | None = None,
        on_exit: Iterable[Callable[[], None]] = (),
        name: str = "kvviz-job",
        cancel: Cancel | None = None,
    ):
        self._work, self._mark, self._name = work, mark, name
        self._exits = list(on_exit)
        self._cond = threading.Condition()
        self._item: T | None = None
        self._item_mark: Any = None
        self._progress: Any = None
        self._items = 0
        self._reports = 0
        self._done = False
        self._error: BaseException | None = None
        self._cancel = cancel or Cancel()  # the call's token: the work reads it too
        self._thread: threading.Thread | None = None

    @property
    def cancelled(self) -> bool:
        """True once the reader went away (the token cancelled as :data:`~kvviz.cancel.GONE`)."""
        return self._cancel.cancelled and self._cancel.reason == GONE

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> Background[T]:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        """The reader went away: cancel the token and stop at the next item; returns at once. (A token
        cancelled for another reason — Stop, the time budget — lets the work end itself and hand over
        its last item.)"""
        self._cancel.cancel(GONE)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the job's thread to end; True if it has."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def _report(self, progress: Any) -> None:
        with self._cond:
            self._progress = progress
            self._reports += 1
            self._cond.notify_all()

    def _run(self) -> None:
        items = None
        try:
            items = iter(self._work(self._report))
            for item in items:
                mark = self._mark(item) if self._mark is not None else None
                with self._cond:
                    self._item, self._item_mark = item, mark
                    self._items += 1
                    self._cond.notify_all()
                if self.cancelled:
                    break
        except BaseException as exc:  # handed to the reader, which raises it where the handler can answer
            self._error = exc
        finally:
            try:
                close = getattr(items, "close", None)
                if close is not None:  # a generator's own clean-up (hooks out, caches freed) runs here, now
                    close()
            finally:
                for fn in self._exits:
                    fn()
                with self._cond:
                    self._done = True
                    self._cond.notify_all()

    def _state(self) -> tuple[int, int, bool]:
        return self._items, self._reports, self._done

    def snapshots(self, interval: float) -> Iterator[Snapshot[T]]:
        """The job's state at most every ``interval`` seconds, only when something changed, and
        once when it ends (then the job's error, if any, is raised instead)."""
        seen = (0, 0, False)
        due = time.monotonic()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._done, max(due - time.monotonic(), 0.0))
                self._cond.wait_for(lambda last=seen: self._state() != last)
                seen = self._state()
                snap = Snapshot(self._item, self._item_mark, self._progress, self._items, self._done)
            if snap.done and self._error is not None:
                raise self._error
            yield snap
            if snap.done:
                return
            due = time.monotonic() + interval
