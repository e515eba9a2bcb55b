"""Who may run the shared model, in what order, and for how long.

A public app serves many people from one model. :class:`Gate` admits model jobs in arrival order,
``slots`` at a time, and refuses at once — before anything waits — when the caller's session
already has a job queued or running (one job per session), when the caller's network address
already holds ``per_address`` jobs (a script that opens a new session per request — every bare
``/call`` request is one — cannot fill the queue), when ``max_waiting`` jobs are already waiting, or when the process's resident memory is above its
ceiling, or when the model time the jobs already queued or running will take (each ticket's estimate)
and this job's would pass ``max_outstanding_s``: a room of short runs takes many jobs, a room with a long
one few, and a job admitted then finishes within the budget it is promised instead of sharing the model
with others as long. Each admitted :class:`Ticket` carries a time budget: a run polls :meth:`Ticket.expired`
(with its Stop flag) and ends cleanly with what it has; a job still running at :data:`REAP_AFTER` times its
budget (it ignored the budget, or its caller never ended it) loses its slot to the line behind it.

Nothing here imports gradio; the UI wraps handlers around it (``kvviz/ui/serving/jobs.py``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvviz.process_memory import current_rss, release_when_idle

REAP_AFTER = 2.0  # × a ticket's budget: past it the gate frees the slot itself (the job should long have stopped)
WAIT_POLL_S = 1.0  # a waiting job looks for slots to free this often

NO_SESSION = "in-process"  # the one key of a caller without a request (a notebook, a test, the server's own work)


class Refused(ValueError):
    """A job the gate will not take; the message says why and what to do, ``reason`` in one word (metrics)."""

    def __init__(self, message: str, reason: str = "other"):
        super().__init__(message)
        self.reason = reason


class Refusals:
    """Refused requests by reason, since the server started (``/metrics``); thread-safe."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


@dataclass(eq=False)
class Ticket:
    """One admitted job: its place in line, then its time budget once it runs."""

    gate: Gate
    session: str
    what: str
    number: int
    max_seconds: float
    address: str | None = None
    cost_s: float = 0.0  # the model time it is estimated to take
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


@dataclass
class Lease:
    """A running ticket as the process that holds the GPU sees it (ZeroGPU's worker, forked or reused): admitted,
    waited for and started by the main process's gate, which also releases it; the time budget counts from the
    same start (``time.monotonic`` is one clock for every process of the machine). Pickled into the GPU call."""

    what: str
    started: float
    max_seconds: float
    timed_out: bool = False

    @classmethod
    def of(cls, ticket: Ticket) -> Lease:
        return cls(ticket.what, ticket.started if ticket.started is not None else time.monotonic(), ticket.max_seconds)

    def position(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def expired(self) -> bool:
        if not self.timed_out and time.monotonic() - self.started > self.max_seconds:
            self.timed_out = True
        return self.timed_out

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def release(self) -> None:
        """Nothing here: the main process releases its ticket when the GPU call returns."""


class Gate:
    """FIFO admission to ``slots`` concurrent model jobs, one per session, with memory and time limits."""

    def __init__(
        self,
        slots: int = 1,
        max_waiting: int = 64,
        max_seconds: float = 300.0,
        max_rss_bytes: int | None = None,
        rss: Callable[[], int | None] = current_rss,
        per_address: int = 0,
        max_outstanding_s: float | None = None,
    ):
        if slots < 1 or max_waiting < 0 or max_seconds <= 0 or per_address < 0:
            raise ValueError("slots ≥ 1, max_waiting ≥ 0, max_seconds > 0 and per_address ≥ 0 are required.")
        self.slots, self.max_waiting, self.max_seconds = slots, max_waiting, max_seconds
        self.per_address = per_address  # jobs one network address may hold here and elsewhere (0: no bound)
        self.max_outstanding_s = max_outstanding_s  # estimated model seconds queued and running (None: no bound)
        self.max_rss_bytes, self._rss = max_rss_bytes, rss
        self._cond = threading.Condition()
        self._waiting: list[Ticket] = []
        self._running: list[Ticket] = []
        self._by_session: dict[str, Ticket] = {}
        self._numbers = itertools.count(1)

    # ---- admission ------------------------------------------------------------------------------
    def admit(
        self,
        session: str | None,
        what: str = "model job",
        address: str | None = None,
        elsewhere: int = 0,
        cost_s: float = 0.0,
        elsewhere_s: float = 0.0,
    ) -> Ticket:
        """A ticket in line, or :class:`Refused` at once with the reason. ``address``: the caller's network
        address, which may hold ``per_address`` jobs, ``elsewhere`` of them in another gate; ``cost_s``: the
        job's estimated model time, admitted while the outstanding time (``elsewhere_s`` of it in another
        gate) leaves room for it — a job alone is always admitted (its cost is bounded before)."""
        session = session or NO_SESSION
        with self._cond:
            self._reap()
            self._refuse_second(session)
            held = elsewhere + self._held_by(address)
            if self.per_address and address is not None and held >= self.per_address:
                raise Refused(
                    f"Your network address already has {held} model jobs queued or running, the most one address "
                    f"may hold on this public server (KVVIZ_JOBS_PER_ADDRESS = {self.per_address}); wait for "
                    "one to finish before starting another.",
                    "per_address",
                )
            self._refuse_costly(cost_s, elsewhere_s)
            if len(self._waiting) >= self.max_waiting:
                raise Refused(
                    f"The server is busy: {len(self._waiting)} jobs are waiting, the most it queues. "
                    "Try again in a minute.",
                    "queue_full",
                )
            self.check_memory()
            ticket = Ticket(self, session, what, next(self._numbers), self.max_seconds, address, cost_s)
            self._waiting.append(ticket)
            self._by_session[session] = ticket
            self._start_ready()
            return ticket

    def outstanding_s(self) -> float:
        """Estimated model seconds of the jobs queued or running here."""
        with self._cond:
            return self._outstanding_s()

    def _outstanding_s(self) -> float:
        return sum(t.cost_s for t in (*self._waiting, *self._running))

    def _refuse_costly(self, cost_s: float, elsewhere_s: float) -> None:
        limit, ahead = self.max_outstanding_s, self._outstanding_s() + elsewhere_s
        if limit is None or ahead <= 0 or ahead + cost_s <= limit:
            return
        raise Refused(
            f"The server is busy with long jobs: those queued or running need about {ahead:,.0f} s of the model, "
            f"and this one about {cost_s:,.0f} s more, beyond the {limit:,.0f} s a job is promised "
            "(KVVIZ_MAX_JOB_SECONDS). Try again in a minute, or use a shorter prompt.",
            "busy_time",
        )

    def held_by(self, address: str | None) -> int:
        """Jobs queued or running here for ``address`` (a second gate's admission counts them)."""
        with self._cond:
            return self._held_by(address)

    def _held_by(self, address: str | None) -> int:
        if address is None:
            return 0
        return sum(1 for t in (*self._waiting, *self._running) if t.address == address)

    def refuse_second(self, session: str | None) -> None:
        """:class:`Refused` when ``session`` already has a job here (a second gate's admission asks)."""
        with self._cond:
            self._refuse_second(session or NO_SESSION)

    def _refuse_second(self, session: str) -> None:
        mine = self._by_session.get(session)
        if mine is not None:
            where = (
                "still running"
                if mine in self._running
                else f"still queued, position {self._waiting.index(mine) + 1} of {len(self._waiting)}"
            )
            raise Refused(
                f"Your previous {mine.what} is {where}; wait for it to finish (or press Stop) before starting another.",
                "second_job",
            )

    def check_memory(self) -> None:
        """:class:`Refused` while the process's resident memory is above the ceiling."""
        limit = self.max_rss_bytes
        rss = self._rss() if limit else None
        if rss is not None and limit and rss > limit:
            raise Refused(
                f"The server is short of memory ({rss / 2**30:.1f} GiB in use, ceiling "
                f"{limit / 2**30:.1f} GiB, KVVIZ_MAX_RSS_GB); new model jobs are "
                "refused until running ones finish. Try again shortly.",
                "memory",
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
                    raise Refused("This job was cancelled before it started.", "cancelled")
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(WAIT_POLL_S if left is None else min(left, WAIT_POLL_S))
                self._reap()
            return True

    def _reap(self) -> None:
        """Free the slots of jobs running past :data:`REAP_AFTER` × their budget (marked ``timed_out``)."""
        now = time.monotonic()
        for ticket in [t for t in self._running if now - (t.started or now) > REAP_AFTER * t.max_seconds]:
            ticket.timed_out = True
            self._free(ticket)

    def release(self, ticket: Ticket) -> None:
        """The job ended (or its caller went away): free its slot or its place in line; the last one out
        hands the memory the jobs freed back to the OS once the gate has stayed idle (:func:`release_when_idle`)."""
        with self._cond:
            was_running = ticket in self._running
            self._free(ticket)
            idle = was_running and not self._running and not self._waiting
        if idle:
            release_when_idle(self._quiet)

    def _quiet(self) -> bool:
        with self._cond:
            return not self._running and not self._waiting

    def _free(self, ticket: Ticket) -> None:
        if not ticket.released:
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
