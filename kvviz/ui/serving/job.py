"""One call of a model job (:class:`Job`) and what it will compute (:class:`Size`): the request checked, its
place at the gate once taken (or, on ZeroGPU, a lease of the main process's place), its cancellation
token and progress. The token (:attr:`Job.cancel`, a :class:`~kvviz.cancel.Cancel`) is the one every
layer of the call reads: the library function (as ``should_stop``), the worker thread, the engine's handle.
:mod:`kvviz.ui.serving.model_job` declares the jobs and wires them into Gradio; this is what one call holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kvviz.admission import Lease, Ticket
from kvviz.cancel import STOPPED, TIME_BUDGET, Cancel
from kvviz.ui.serving.context import AppContext
from kvviz.ui.serving.streaming import Background

R = TypeVar("R")


@dataclass(frozen=True)
class Size:
    """What a job will compute, for its cost estimate (:func:`kvviz.limits.job_cost`) and its GPU lease."""

    prompt_tokens: int
    new_tokens: int
    runs: int = 1
    window: int | None = None
    repeat_passes: tuple[tuple[int, int], ...] = ()  # (cached, fed) per repeat pass (KVzip): see job_cost


class Job(Generic[R]):
    """One call of a model job: its checked request, its place at the gate once taken, its Stop and progress."""

    # spec: the ModelJob this call runs (its what, stop, room, size: read here, declared there)
    def __init__(self, ctx: AppContext, spec: Any, req: R, request, progress, ticket: Lease | None = None):
        self.ctx, self.spec, self.req, self.request = ctx, spec, req, request
        self._progress = progress
        self.ticket: Ticket | Lease | None = ticket  # a Lease: admitted by the main process (ZeroGPU's worker)
        self._worker: Background | None = None
        self.flag: threading.Event | None = ctx.stop_flag(request) if spec.stop else None
        if self.flag is not None:
            self.flag.clear()
        # Stop pressed, the time budget spent, or (see close) the page went away: the call ends now
        self.cancel = Cancel((lambda: self.stopped, STOPPED), (self._expired, TIME_BUDGET))

    # ---- the gate -----------------------------------------------------------------------------------
    def admit(self, size: Size | None = None) -> Ticket | Lease:
        """This call's place in line (refused at once with the reason); ``size`` overrides the declared one."""
        if self.ticket is None:
            s = size or self.spec.size(self.req)
            self.ticket = self.ctx.jobs.admit(
                self.request,
                self.spec.what,
                s.prompt_tokens,
                s.new_tokens,
                s.runs,
                s.window,
                room=self.spec.room,
                repeat_passes=s.repeat_passes,
            )
        return self.ticket

    def slot(self, size: Size | None = None) -> Ticket | Lease:
        """Admitted, then waited for: the job may run now."""
        ticket = self.admit(size)
        ticket.wait()
        return ticket

    def turns(self) -> Iterator[str]:
        """Admitted, then "Queued: position 3 of 7" lines while it waits (a streaming job yields them)."""
        yield from self.ctx.jobs.turns(self.admit())  # type: ignore[arg-type]  # a Lease never waits

    def waited(self) -> Ticket:
        """Admitted and waited for, "Queued" on the progress bar meanwhile (ZeroGPU: before the GPU call)."""
        ticket = self.admit()
        assert isinstance(ticket, Ticket)
        while not ticket.wait(0.5):
            self.progress(0.0, f"Queued: position {max(ticket.position(), 1)}, waiting for the model")
        return ticket

    def release(self) -> None:
        if self.ticket is not None:
            self.ticket.release()

    # ---- while it runs --------------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        """The session pressed Stop (for jobs declared with ``stop=True``)."""
        return self.flag is not None and self.flag.is_set()

    def _expired(self) -> bool:
        return self.ticket is not None and self.ticket.expired()

    def progress(self, fraction: float, desc: str = "") -> None:
        """Gradio's progress bar (a no-op where the job was declared without ``progress``)."""
        if self._progress is not None:
            self._progress(fraction, desc)

    @property
    def timed_out(self) -> bool:
        return self.ticket is not None and self.ticket.timed_out

    def timeout_note(self) -> str:
        return self.ctx.jobs.timeout_note(self.ticket) if self.ticket is not None else ""  # type: ignore[arg-type]

    def background(
        self, work: Callable[[Callable[[Any], None]], Iterable], mark: Callable | None = None, name: str = "kvviz-job"
    ) -> Background:
        """Run ``work`` in a worker thread (:class:`~kvviz.ui.serving.streaming.Background`); the slot goes
        back there once the model has really stopped, so the next job never overlaps this one."""
        self._worker = Background(work, mark=mark, on_exit=[self.release], name=name, cancel=self.cancel)
        return self._worker.start()

    def close(self) -> None:
        if self._worker is not None and self._worker.started:
            self._worker.cancel()  # a page that went away: the worker stops at its next step and releases
        else:
            self.release()
        if self.flag is not None:
            self.ctx.forget_session(self.request)
