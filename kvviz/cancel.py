"""One run's cancellation token (:class:`Cancel`): set once by whoever ends the run, read by every layer.

A run can end early for several reasons — the session pressed Stop, its time budget ran out, the
page went away, every caller following a shared engine run stopped following it. Each is one
condition on one token: the serving call (:class:`kvviz.ui.serving.job.Job`) creates it, its worker
thread, the engine's :class:`~kvviz.engine.handle.Handle` and the :class:`~kvviz.capture.generation.Generation`
read the same object, so there is one question ("cancelled?") and one answer, with its reason.
A token is a ``Callable[[], bool]``: every library function's ``should_stop`` takes it as is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# why a run was cancelled (Cancel.reason)
STOPPED = "stopped"  # the session pressed Stop, or a caller's own condition held
TIME_BUDGET = "time budget"  # the call ran past its admitted time (kvviz.admission)
GONE = "page closed"  # nobody reads the run any more: its worker stops at the next item
ABANDONED = "every caller stopped"  # a shared engine run that no caller follows


class Cancel:
    """A run's cancellation token. ``cancel(reason)`` sets it; a watched condition (a session's Stop
    flag, a ticket's time budget: cheap callables polled on each read) sets it the first time it
    holds. Once set it stays set, and ``reason`` says why."""

    def __init__(self, *watch: tuple[Callable[[], bool], str]):
        self._event = threading.Event()
        self._watch: list[tuple[Callable[[], bool], str]] = list(watch)
        self.reason: str | None = None

    @classmethod
    def of(cls, stop: Cancel | Callable[[], bool] | None) -> Cancel:
        """``stop`` as a token: itself, a token watching a plain callable, or a fresh one (None)."""
        if isinstance(stop, Cancel):
            return stop
        return cls() if stop is None else cls((stop, STOPPED))

    def watch(self, condition: Callable[[], bool], reason: str) -> Cancel:
        """Also cancel once ``condition()`` holds (read on every check of the token)."""
        self._watch.append((condition, reason))
        return self

    def cancel(self, reason: str = STOPPED) -> None:
        """End the run at its next step; the first reason stays."""
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        if not self._event.is_set():
            for condition, reason in list(self._watch):
                if condition():
                    self.cancel(reason)
                    break
        return self._event.is_set()

    def __call__(self) -> bool:
        return self.cancelled

    def __repr__(self) -> str:
        return f"Cancel({self.reason!r})" if self._event.is_set() else "Cancel()"
