"""The app's gates to the model: admission with the deployment's limits, refused politely.

Every handler that runs the model is a :class:`~kvviz.ui.serving.model_job.ModelJob`, which follows the
same steps here:

1. its inputs are checked (``kvviz.safety`` / ``kvviz.limits``) — a bad request is told at once; a
   button's check step also asks :meth:`Jobs.precheck` whether the job would be refused now, and takes
   nothing (a client that sends only checks holds no place);
2. when the run step starts, :meth:`Jobs.admit` — the job's cost is estimated and checked, and the session
   gets its one place in line (a second job of the same session, a full line or a server short of memory
   is refused at once, with the reason);
3. it waits for its turn (:meth:`Jobs.turns` yields the line position for a streaming handler), runs
   with ``ticket.expired`` polled beside the Stop flag, and releases the ticket in ``finally``.

Handlers are registered with no Gradio concurrency limit: the gates are the queues for the model,
so checks and refusals never wait behind running jobs. Generate runs pass :attr:`Jobs.room`, whose
many slots feed the batching engine (``kvviz.engine``); every other model job passes the one-at-a-time
:attr:`Jobs.gate`. A session holds one job in either, never one in each.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import gradio as gr

from kvviz.admission import Gate, Refusals, Refused, Ticket
from kvviz.capture.trace import ModelInfo
from kvviz.limits import check_cost, job_cost, model_seconds
from kvviz.settings import Settings
from kvviz.ui.serving.identity import client_of, session_of

log = logging.getLogger("kvviz")


class UserError(gr.Error):
    """A refusal the user can fix: shown as a message, logged as one line (no stack trace)."""

    def __init__(self, message: str, **kwargs):
        kwargs.setdefault("print_exception", False)
        super().__init__(message, **kwargs)
        log.info("refused: %s", message.replace("\n", " ")[:300])


class Jobs:
    """The app's gate to the model, with the deployment's limits."""

    def __init__(self, settings: Settings, info: ModelInfo):
        self.settings, self.info = settings, info
        self.gate = Gate(
            slots=settings.concurrency,
            max_waiting=settings.queue_size,
            max_seconds=settings.max_job_seconds,
            max_rss_bytes=int(settings.max_rss_gb * 2**30),
            per_address=settings.jobs_per_address,
            max_outstanding_s=settings.max_job_seconds,
        )
        self.room = Gate(  # Generate runs: the engine decodes them together
            slots=settings.room_size,
            max_waiting=settings.queue_size,
            max_seconds=settings.max_job_seconds,
            max_rss_bytes=int(settings.max_rss_gb * 2**30),
            per_address=settings.jobs_per_address,
            max_outstanding_s=settings.max_job_seconds,
        )
        # by default the largest job is four runs at the longest prompt and generation allowed (a comparison of
        # three policies with the full cache); the time budget bounds it too
        ceiling = job_cost(
            settings.max_prompt_tokens, settings.max_new_tokens, info.layers, info.kv_bytes_per_token, runs=4
        )
        self.max_key_reads = settings.max_key_reads or ceiling.key_reads
        self.refusals = Refusals()  # by reason, for /metrics

    def admit(
        self,
        request: gr.Request | None,
        what: str,
        prompt_tokens: int,
        new_tokens: int,
        runs: int = 1,
        window: int | None = None,
        room: bool = False,
        repeat_passes: tuple[tuple[int, int], ...] = (),
    ) -> Ticket:
        """A place in line for this session's job, or :class:`UserError` at once (see :func:`job_cost`);
        ``room``: a Generate run, admitted to the engine's gate. Only a run step that is about to run asks."""
        gate = self._refusals(request, prompt_tokens, new_tokens, runs, window, room, repeat_passes)
        other = self.gate if room else self.room
        cost = self._cost(prompt_tokens, new_tokens, runs, window, repeat_passes)
        address = client_of(request, self.settings.proxy_hops)
        try:
            return gate.admit(
                session_of(request),
                what,
                address,
                other.held_by(address),
                cost_s=model_seconds(cost, self.settings.key_reads_per_s),
                elsewhere_s=other.outstanding_s(),
            )
        except Refused as exc:
            self.refusals.count(exc.reason)
            raise UserError(str(exc)) from None

    def precheck(
        self,
        request: gr.Request | None,
        prompt_tokens: int,
        new_tokens: int,
        runs: int = 1,
        window: int | None = None,
        room: bool = False,
        repeat_passes: tuple[tuple[int, int], ...] = (),
    ) -> None:
        """:class:`UserError` now if :meth:`admit` would refuse this job now; takes no place in line (a button's
        check step asks, so its refusal is a toast while the page keeps its results)."""
        gate = self._refusals(request, prompt_tokens, new_tokens, runs, window, room, repeat_passes)
        snap = gate.snapshot()
        if snap["running"] >= gate.slots and snap["waiting"] >= gate.max_waiting:
            self.refusals.count("queue_full")
            raise UserError(
                f"The server is busy: {snap['waiting']} jobs are waiting, the most it queues. Try again in a minute."
            )
        try:
            gate.refuse_second(session_of(request))
        except Refused as exc:
            self.refusals.count(exc.reason)
            raise UserError(str(exc)) from None

    def _cost(self, prompt_tokens, new_tokens, runs, window, repeat_passes):
        info = self.info
        return job_cost(prompt_tokens, new_tokens, info.layers, info.kv_bytes_per_token, runs, window, repeat_passes)

    def _refusals(self, request, prompt_tokens, new_tokens, runs, window, room, repeat_passes=()) -> Gate:
        """The gate this job would pass; :class:`UserError` for memory, cost or a second job elsewhere."""
        cost = self._cost(prompt_tokens, new_tokens, runs, window, repeat_passes)
        gate, other = (self.room, self.gate) if room else (self.gate, self.room)
        try:
            gate.check_memory()
            check_cost(cost, self.max_key_reads, gate.spare_bytes())
            other.refuse_second(session_of(request))
        except (Refused, ValueError) as exc:
            self.refusals.count(getattr(exc, "reason", "cost"))
            raise UserError(str(exc)) from None
        return gate

    def turns(self, ticket: Ticket, poll: float = 1.0) -> Iterator[str]:
        """While the ticket waits: a line like "Queued: position 3 of 7" every ``poll`` seconds."""
        while not ticket.wait(poll):
            pos = ticket.position()
            if pos > 0:
                waiting = ticket.gate.snapshot()["waiting"]  # the line of the gate this ticket waits at
                yield f"Queued: position {pos} of {waiting} — your run starts when the ones before it finish."

    def timeout_note(self, ticket: Ticket) -> str:
        """What to tell the user when a run ended on its time budget (else "")."""
        if not ticket.timed_out:
            return ""
        return (
            f" · stopped at the time budget of {ticket.max_seconds:g} s (KVVIZ_MAX_JOB_SECONDS): "
            "what was done so far is shown"
        )
