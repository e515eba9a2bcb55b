"""One shared store of ready demo results, keyed by (model, demo, settings), so a result is computed once.

The app plans the results its "show me" buttons and demo buttons need (:meth:`DemoStore.plan`), a
background thread computes them at start-up, and every session reads the same objects (read-only).
A request for a planned key either finds the result, waits for the computation already running for
it (never a second copy of it), or claims it and computes it itself. A failed or cut-short
computation leaves the key unclaimed, so the next request tries again. Unplanned keys are never
stored: the store holds a fixed, small set of results. A result an earlier server wrote to disk is
put back as done (:meth:`DemoStore.restore`, source "stored") and computed again later
(:meth:`DemoStore.refresh`), its old value served until the new one replaces it; ``on_done`` is told
of every new result (the app writes it to disk).

Nothing here imports gradio or torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

Progress = Callable[[float, str], None]
Compute = Callable[[Progress, Callable[[], bool]], Any]  # (progress, should_stop) → result


@dataclass(eq=False)
class Entry:
    """One planned result: how to compute it, and its state (pending → running → done)."""

    key: Hashable
    label: str
    compute: Compute
    state: str = "pending"  # pending | running | done
    value: Any = None
    source: str = ""  # who computed it: "start-up" or "a request"
    finished_at: float | None = None  # time.time() when it was stored
    seconds: float | None = None  # how long the computation took
    fraction: float = 0.0
    desc: str = ""
    error: BaseException | None = None
    restored: Callable[[Any], None] | None = None  # told of a value read back from disk (before it is served)
    stale: bool = False  # the value was read back from disk: a refresh is due
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def report(self, fraction: float, desc: str = "") -> None:
        """Progress of the running computation (read by the requests waiting for it)."""
        self.fraction, self.desc = max(0.0, min(1.0, float(fraction))), desc or self.desc

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the entry is no longer running; True when it is done."""
        with self._cond:
            if self.state == "running":
                self._cond.wait(timeout)
            return self.state == "done"


def _quiet(fraction: float, desc: str = "") -> None:
    """A refresh's progress: nobody waits for it (the stored value is served meanwhile)."""


class DemoStore:
    """Planned results for one app (one per server process), shared by every session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Hashable, Entry] = {}
        self._shared: dict[int, Any] = {}  # objects inside stored results that views may memoize on (by id)
        self.on_done: Callable[[Entry], None] | None = None

    def plan(self, key: Hashable, label: str, compute: Compute, restored: Callable[[Any], None] | None = None) -> Entry:
        """Register a result the app will need (a second plan of the same key keeps the first). ``restored``
        is called with a value read back from disk, before it is served (e.g. to mark a trace shared)."""
        with self._lock:
            return self._entries.setdefault(key, Entry(key, label, compute, restored=restored))

    def put_first(self, keys: list[Hashable]) -> None:
        """Compute these planned keys first, in this order (the order a lecture reaches them)."""
        with self._lock:
            first = {k: self._entries[k] for k in keys if k in self._entries}
            self._entries = {**first, **{k: e for k, e in self._entries.items() if k not in first}}

    def planned(self, key: Hashable) -> bool:
        return key in self._entries

    def entry(self, key: Hashable) -> Entry | None:
        return self._entries.get(key)

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def claim(self, key: Hashable) -> tuple[Entry | None, bool]:
        """(entry, True) when the caller must compute it now; (entry, False) when it is done or running
        elsewhere (wait on it); (None, False) when the key was never planned."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None, False
            with entry._cond:
                if entry.state != "pending":
                    return entry, False
                entry.state, entry.fraction, entry.desc, entry.error = "running", 0.0, "", None
                return entry, True

    def fulfil(self, entry: Entry, value: Any, source: str, seconds: float) -> None:
        """The claimed computation finished: keep its result and wake everyone waiting."""
        with entry._cond:
            entry.value, entry.source, entry.seconds, entry.stale = value, source, seconds, False
            entry.state, entry.finished_at, entry.fraction = "done", time.time(), 1.0
            entry._cond.notify_all()
        if self.on_done is not None:
            self.on_done(entry)

    def restore(self, entry: Entry, value: Any, finished_at: float | None, seconds: float | None) -> bool:
        """A value an earlier server stored for a pending entry: done now, marked stale (False if it was not
        pending any more)."""
        if entry.restored is not None:
            entry.restored(value)
        with entry._cond:
            if entry.state != "pending":
                return False
            entry.value, entry.source, entry.seconds, entry.stale = value, "stored", seconds, True
            entry.state, entry.finished_at, entry.fraction = "done", finished_at or time.time(), 1.0
            entry._cond.notify_all()
            return True

    def refresh(self, entry: Entry, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Compute a stale entry again while its stored value is served; True once the new value replaced it.
        A failure keeps the stored value."""
        if entry.state != "done" or not entry.stale:
            return False
        t0 = time.perf_counter()
        value = entry.compute(_quiet, should_stop)
        if should_stop():
            return False
        self.fulfil(entry, value, "start-up", time.perf_counter() - t0)
        return True

    def fail(self, entry: Entry, error: BaseException | None = None) -> None:
        """The claimed computation failed or was cut short: waiters get ``error``, the key is free again."""
        with entry._cond:
            entry.state, entry.error, entry.value = "pending", error, None
            entry._cond.notify_all()

    def run(
        self,
        entry: Entry,
        source: str,
        should_stop: Callable[[], bool] = lambda: False,
        progress: Progress | None = None,
    ) -> Any:
        """Compute a claimed entry here and store it (or free it again if it raised or was stopped)."""

        def report(fraction: float, desc: str = "") -> None:
            entry.report(fraction, desc)
            if progress is not None:
                progress(fraction, desc)

        t0 = time.perf_counter()
        try:
            value = entry.compute(report, should_stop)
        except BaseException as exc:
            self.fail(entry, exc)
            raise
        if should_stop():
            self.fail(entry)
        else:
            self.fulfil(entry, value, source, time.perf_counter() - t0)
        return value

    def share(self, obj: Any) -> None:
        """Mark an object of a stored result as shared: views drawn from it may be kept and reused."""
        with self._lock:
            self._shared[id(obj)] = obj

    def is_shared(self, obj: Any) -> bool:
        return id(obj) in self._shared and self._shared[id(obj)] is obj

    def counts(self) -> dict[str, int]:
        """How many planned results are pending, running and done."""
        out = {"pending": 0, "running": 0, "done": 0}
        for e in self.entries():
            out[e.state] += 1
        return out
