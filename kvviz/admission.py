"""Who may run the shared model, in what order, and for how long.

A public app serves many people from one model. :class:`Gate` admits model jobs in arrival order,
``slots`` at a time, and refuses at once — before anything waits — when the caller's session
already has a job queued or running (one job per session, so a script cannot fill the queue),
when ``max_waiting`` jobs are already waiting, or when the process's resident memory is above its
ceiling. Each admitted :class:`Ticket` carries a time budget: a run polls :meth:`Ticket.expired`
(with its Stop flag) and ends cleanly with what it has.

Nothing here imports gradio; the UI wraps handlers around it (``kvviz/ui/serving/jobs.py``).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class Refused(ValueError):
    """A job the gate will not take; the message says why and what to do."""


def current_rss() -> int | None:
    """This process's resident memory in bytes (Linux ``/proc``; ``None`` where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def machine_memory() -> int | None:
    """Physical memory of the machine in bytes, where the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(eq=False)
class Ticket:
    """One admitted job: its place in line, then its time budget once it runs."""

    gate: Gate
    session: str
    what: str
    number: int
    max_seconds: float
    started: float | None = None
    timed_out: bool = False
    released: bool = False
    _done: threading.Event = field(default_factory=threading.Event)

    def position(self) -> int:
        """1 = next to run; 0 = running."""
        return self.gate.position(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job may run (True), or until ``timeout`` seconds pass while still in line (False)."""
        return self.gate.wait(self, timeout)

    def expired(self) -> bool:
        """True once the job has run longer than its budget (remembered in ``timed_out``)."""
        if self.started is not None and not self.timed_out and time.monotonic() - self.started > self.max_seconds:
            self.timed_out = True
        return self.timed_out

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def release(self) -> None:
        self.gate.release(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Gate:
    """FIFO admission to ``slots`` concurrent model jobs, one per session, with memory and time limits."""

    def __init__(
        self,
        slots: int = 1,
        max_waiting: int = 64,
        max_seconds: float = 300.0,
        max_rss_bytes: int | None = None,
        rss: Callable[[], int | None] = current_rss,
    ):
        if slots < 1 or max_waiting < 0 or max_seconds <= 0:
            raise ValueError("slots ≥ 1, max_waiting ≥ 0 and max_seconds > 0 are required.")
        self.slots, self.max_waiting, self.max_seconds = slots, max_waiting, max_seconds
        self.max_rss_bytes, self._rss = max_rss_bytes, rss
        self._cond = threading.Condition()
        self._waiting: list[Ticket] = []
        self._running: list[Ticket] = []
        self._by_session: dict[str, Ticket] = {}
        self._numbers = itertools.count(1)

    # ---- admission ------------------------------------------------------------------------------
    def admit(self, session: str | None, what: str = "model job") -> Ticket:
        """A ticket in line, or :class:`Refused` at once with the reason."""
        session = session or "anonymous"
        with self._cond:
            self._refuse_second(session)
            if len(self._waiting) >= self.max_waiting:
                raise Refused(
                    f"The server is busy: {len(self._waiting)} jobs are waiting, the most it queues. "
                    "Try again in a minute."
                )
            self.check_memory()
            ticket = Ticket(self, session, what, next(self._numbers), self.max_seconds)
            self._waiting.append(ticket)
            self._by_session[session] = ticket
            self._start_ready()
            return ticket

    def refuse_second(self, session: str | None) -> None:
        """:class:`Refused` when ``session`` already has a job here (a second gate's admission asks)."""
        with self._cond:
            self._refuse_second(session or "anonymous")

    def _refuse_second(self, session: str) -> None:
        mine = self._by_session.get(session)
        if mine is not None:
            where = (
                "still running"
                if mine in self._running
                else f"still queued, position {self._waiting.index(mine) + 1} of {len(self._waiting)}"
            )
            raise Refused(
                f"Your previous {mine.what} is {where}; wait for it to finish (or press Stop) before starting another."
            )

    def check_memory(self) -> None:
        """:class:`Refused` while the process's resident memory is above the ceiling."""
        limit = self.max_rss_bytes
        rss = self._rss() if limit else None
        if rss is not None and limit and rss > limit:
            raise Refused(
                f"The server is short of memory ({rss / 2**30:.1f} GiB in use, ceiling "
                f"{limit / 2**30:.1f} GiB, KVVIZ_MAX_RSS_GB); new model jobs are "
                "refused until running ones finish. Try again shortly."
            )

    def spare_bytes(self) -> int | None:
        """Memory a new job may still use before the ceiling (None when there is no ceiling)."""
        if not self.max_rss_bytes:
            return None
        rss = self._rss()
        return None if rss is None else max(0, self.max_rss_bytes - rss)

    # ---- waiting and running ----------------------------------------------------------------------
    def _start_ready(self) -> None:
        while self._waiting and len(self._running) < self.slots:
            ticket = self._waiting.pop(0)
            ticket.started = time.monotonic()
            self._running.append(ticket)
            self._cond.notify_all()

    def position(self, ticket: Ticket) -> int:
        with self._cond:
            if ticket in self._running:
                return 0
            return self._waiting.index(ticket) + 1 if ticket in self._waiting else -1

    def wait(self, ticket: Ticket, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while ticket not in self._running:
                if ticket.released:
                    raise Refused("This job was cancelled before it started.")
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def release(self, ticket: Ticket) -> None:
        """The job ended (or its caller went away): free its slot or its place in line."""
        with self._cond:
            if ticket.released:
                return
            ticket.released = True
            if ticket in self._running:
                self._running.remove(ticket)
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            if self._by_session.get(ticket.session) is ticket:
                del self._by_session[ticket.session]
            self._start_ready()
            self._cond.notify_all()

    def close(self) -> None:
        """The server is stopping: every running job's time budget ends now (it stops at its next poll of
        :meth:`Ticket.expired`, with what it has), jobs in line are cancelled and no new one is admitted."""
        with self._cond:
            self.max_waiting = self.slots = 0
            for ticket in self._running:
                ticket.timed_out = True
            for ticket in list(self._waiting):
                self.release(ticket)

    def snapshot(self) -> dict:
        """Counts for logs, tests and the load bench."""
        with self._cond:
            return {"running": len(self._running), "waiting": len(self._waiting), "sessions": len(self._by_session)}
