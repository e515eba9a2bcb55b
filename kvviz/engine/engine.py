"""The engine that serves a room: one thread, one model, every waiting run decoded together.

Callers :meth:`Engine.submit` a run and get a :class:`Handle` (its growing Trace, its progress, its end). The engine's
thread loops over steps; at each step boundary it admits waiting runs into the batch (continuous batching, at most
``max_batch`` runs), builds one packed forward (:mod:`kvviz.capture.packed`) of every running sequence's next feed —
one token per decoding run, a prompt chunk per prefilling run, at most ``token_budget`` tokens in all — and hands each
sequence its logits (:class:`~kvviz.capture.generation.Generation` does the rest, as in a solo run); the step's linear
layers take the few-rows route (:mod:`kvviz.engine.few_rows`). A run leaves the batch when it ends or every caller
following it has cancelled; runs that asked for the equivalence check are recomputed together
(:mod:`kvviz.capture.verify`), when :meth:`Engine._check_due` says.

An idle engine may gather before its first step (``KVVIZ_GATHER_MS``): a room pressing Generate together reaches the
server over a second, and a step, once begun, admits no one until it ends. The first run then waits until no new run
has come for ``gather_s`` seconds (at most ``gather_max_s``, or until the batch is full).

Identical requests (same prompt ids and settings: every run is seeded, so equal requests compute equal Traces) share
one run; a finished run is kept for a while so a late duplicate gets it at once. Prompts start from the
:class:`~kvviz.engine.prefix.PrefixStore`'s longest cached prefix; a new run whose leading blocks another run is
computing in the same step (a cold room's shared system prompt) waits for them to be stored, a step, instead of
computing them again.

Models that cannot be packed (sliding windows, MLA, legacy attention) go through it one forward per run a step.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from kvviz import openmp
from kvviz.cancel import Cancel
from kvviz.capture.attention_fn import Held
from kvviz.capture.generation import Generation
from kvviz.capture.model_io import Progress, forward
from kvviz.capture.options import options
from kvviz.capture.packed import Segment, packable, packed_forward
from kvviz.capture.trace import Trace
from kvviz.capture.verify import check
from kvviz.engine.chat_turn import keep_turn, store_turn
from kvviz.engine.disk_tier import DiskTier
from kvviz.engine.few_rows import few_rows, prepare
from kvviz.engine.handle import FinishedRuns, Handle, Run
from kvviz.engine.prefix import PrefixStore
from kvviz.engine.slots import SlotKV
from kvviz.models import LoadedModel, attention_modules
from kvviz.process_memory import release_when_idle

log = logging.getLogger("kvviz.engine")
ROOM_WAIT = 5  # beside a room, a finished run's check waits at most this many times check_wait_s
COUNTERS = ("submitted", "shared", "forwards", "batched_tokens", "max_batch_seen", "checks")  # Engine.counters


class Engine:
    """See the module docstring. ``max_batch`` runs decode together; a step feeds at most
    ``token_budget`` tokens; ``keep_finished`` finished runs (their traces at most
    :data:`~kvviz.limits.FINISHED_RUNS_BYTES` together) answer late duplicates; a finished run
    waits at most ``check_wait_s`` seconds for others to share its check; an idle engine gathers runs
    for ``gather_s`` seconds of quiet (at most ``gather_max_s``) before its first step (0: it does not)."""

    def __init__(
        self,
        lm: LoadedModel,
        *,
        max_batch: int = 32,
        token_budget: int = 512,
        prefix_cache_bytes: int = 256 * 2**20,
        keep_finished: int = 16,
        check_wait_s: float = 2.0,
        gather_s: float = 0.0,
        gather_max_s: float = 1.0,
        prefix_disk: DiskTier | None = None,
        session_salt: bool = False,
    ):
        if max_batch < 1 or token_budget < 1:
            raise ValueError("max_batch and token_budget must be at least 1.")
        if check_wait_s < 0 or gather_s < 0 or gather_max_s < 0:
            raise ValueError("check_wait_s, gather_s and gather_max_s must not be negative.")
        self.gather_s, self.gather_max_s = gather_s, gather_max_s
        self._last_new = 0.0  # when the latest run that needs its own computation was submitted
        self.lm, self.max_batch, self.token_budget = lm, max_batch, token_budget
        self.packable = packable(lm)
        prepare(lm)  # a packed step's few rows per weight take the faster route in the engine's thread
        salt = f"{lm.name}:{lm.dtype}"  # a second tier (prefix_disk) and per-session salts: see PrefixStore
        store = PrefixStore(prefix_cache_bytes, salt=salt, disk=prefix_disk, session_salt=session_salt)
        self.prefix = store if self.packable else None
        # short runs keep their keys and values side by side, so a decode step appends and attends for all at once
        self.slots = SlotKV(len(attention_modules(lm.model)), max_batch) if self.packable else None
        self._cond = threading.Condition()
        self._waiting: deque[Run] = deque()
        self._running: list[Run] = []
        self._active: dict[tuple, Run] = {}
        self._finished = FinishedRuns(keep_finished)
        self.check_wait_s = check_wait_s
        self._step_s = 0.0  # how long the latest step took
        self._unchecked: list[tuple[Run, float]] = []  # finished runs waiting for their check (engine thread only)
        self._thread: threading.Thread | None = None
        self._capture = Held(lm.model)  # installed across the steps of a busy spell, not once per step
        self._closed = False
        self.counters = dict.fromkeys(COUNTERS, 0)
        # where the engine's thread spent its time (seconds): waiting for work, gathering a room, steps that
        # fed a prompt chunk, steps of decoding runs only, checks (the load bench's breakdown reads the deltas)
        self.seconds = dict.fromkeys(("idle", "gathering", "prefill_steps", "decode_steps", "checks"), 0.0)

    # ---- callers --------------------------------------------------------------------------------
    def submit(
        self,
        prompt: str,
        cancel: Cancel | Callable[[], bool] | None = None,
        owner: str | None = None,
        keep_turn: bool = False,
        **kwargs,
    ) -> Handle:
        """Queue a run (:func:`~kvviz.capture.options.options`' flat keywords; bad ones raise here, in the
        caller's thread) and return its handle; an identical run queued, running or just finished is shared.
        ``cancel``: the caller's token (:class:`~kvviz.cancel.Cancel`, or a callable it watches); the run
        stops once no caller follows. ``owner``: who sent it (a session; None: the server, whose prompts
        anyone may read), so a public blocks view shows a prompt's text only to a session that sent it.
        ``keep_turn``: a chat turn — once it ends, the prefix store keeps its prompt's and answer's blocks
        for the next turn (``Trace.turn_cached_tokens`` says how many it reused)."""
        gen, token = Generation(self.lm, prompt, **options(**kwargs)), Cancel.of(cancel)
        openmp.release()  # the caller hands its model work over: its OpenMP workers would slow the engine's
        key = (*self._key(gen, owner), bool(keep_turn))
        with self._cond:
            if self._closed:
                raise RuntimeError("The server is shutting down; try again once it is back.")
            self.counters["submitted"] += 1
            run = self._active.get(key) or self._finished.get(key)
            if run is not None and not (run.finished and run.error is not None):
                self.counters["shared"] += 1
                handle = Handle(run, token)
                run.handles.append(handle)
                if owner not in run.owners:  # the same prompt, sent by someone else too
                    run.owners.add(owner)
                    if self.prefix is not None:
                        self.prefix.own(run.claim.hashes, owner)
                return handle
            run = Run(gen, owner, key, keep_turn=bool(keep_turn))
            handle = Handle(run, token)
            run.handles.append(handle)
            self._active[key] = run
            self._waiting.append(run)
            self._last_new = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="kvviz-engine", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return handle

    def _key(self, gen: Generation, owner: str | None) -> tuple:
        """Identical requests share one run, but a salted store's sessions share nothing: not even a run."""
        salted = self.prefix is not None and self.prefix.session_salt
        return (*gen.key(), owner) if salted else gen.key()

    def warm(self, prompt: str, chat: bool = True) -> Trace:
        """Run ``prompt`` for one new token, before a room arrives: the prefix store keeps its prompt's
        blocks — with the chat template, the template and system prompt every chat request starts with —
        and the engine's first forward (the weights' first reads, the first allocations) is behind it.
        A cold room would otherwise compute those blocks in a step of their own while it waits."""
        return self.submit(prompt, chat=chat, max_new_tokens=1).result()

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the engine's thread after its current step (the server is stopping): runs waiting or decoding end
        with an error, later submits are refused. True once the thread has ended — a thread still inside a
        forward when the interpreter exits aborts the process ("terminate called without an active exception")."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def snapshot(self) -> dict:
        """Counts for logs, the blocks view and the load bench."""
        with self._cond:
            out: dict[str, Any] = dict(self.counters, waiting=len(self._waiting), running=len(self._running))
            out["seconds"] = {phase: round(s, 3) for phase, s in self.seconds.items()}
        if self.prefix is not None:
            out["prefix_cache"] = self.prefix.stats()
        return out

    # ---- the engine's thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:  # no local outlives a step: a finished run's cache is freed while the engine waits
            self._advance(self._admit())
            if self._idle():
                self._capture.release()  # (a step whose runs all ended before its forward held it still)
                openmp.release()  # no OpenMP workers held while idle: a solo run in another thread gets full speed
                release_when_idle(self._idle)  # the room's freed caches go back to the OS once the engine stays idle
        self._capture.release()
        closing = RuntimeError("The server is shutting down; the run was ended.")
        with self._cond:
            runs = [*self._waiting, *self._running, *(run for run, _ in self._unchecked)]
            self._waiting.clear()
            self._unchecked.clear()
        for run in runs:
            self._retire(run, closing)

    def _idle(self) -> bool:
        with self._cond:
            return not (self._waiting or self._running or self._unchecked)

    def _admit(self) -> list[Run]:
        """Wait for work; move waiting runs into the batch while there is room; the batch."""
        with self._cond:
            t0 = time.monotonic()
            self._cond.wait_for(lambda: self._waiting or self._running or self._unchecked or self._closed)
            t1 = time.monotonic()
            self.seconds["idle"] += t1 - t0
            if self._closed:
                return []
            if self.gather_s and not self._running and not self._unchecked:
                self._gather()
                self.seconds["gathering"] += time.monotonic() - t1
            while self._waiting and len(self._running) < self.max_batch:
                run = self._waiting.popleft()
                if run.cancel.cancelled:
                    self._retire(run, None)
                    continue
                self._running.append(run)
            if self.slots is not None:  # new runs take their slots together (one growth); slotted caches are skipped
                fresh = [r.gen for r in self._running if r.gen.default_cache and r.gen.fed == 0]
                self.slots.attach_all([(g.cache, g.trace.n_prompt + g.max_new_tokens) for g in fresh])
            return list(self._running)

    def _gather(self) -> None:
        """With the lock held and the engine idle: wait while runs keep arriving (see the module docstring)."""
        first = time.monotonic()
        while len(self._waiting) < self.max_batch:
            now = time.monotonic()
            left = min(self._last_new + self.gather_s, first + self.gather_max_s) - now
            if left <= 0:
                return
            self._cond.wait(left)

    def _advance(self, batch: list[Run]) -> None:
        try:
            if batch:
                t0 = time.monotonic()
                phase = "prefill_steps" if any(run.gen.prefilling for run in batch) else "decode_steps"
                self._step(batch)
                self._step_s = time.monotonic() - t0
                self.seconds[phase] += self._step_s
        except Exception as exc:  # a fault ends the runs of this step, never the engine
            # as text: a logged exception object would keep the failed step's frames (and caches) alive
            log.error("engine step failed:\n%s", traceback.format_exc())
            for run in batch:
                if not run.finished and run not in (j for j, _ in self._unchecked):
                    self._retire(run, exc)
        self._check_due()

    def _step(self, batch: list[Run]) -> None:
        # all of it in inference mode: a run submitted from inside inference mode holds inference
        # tensors, which even the prefix store's replay into its recorder may only update there
        with torch.inference_mode():
            self._step_inference(batch)

    def _step_inference(self, batch: list[Run]) -> None:
        """One packed forward of every running run's next feed. A run's own work before and after the forward
        (its prefix claim, its feed, sampling its token, storing its blocks) runs in :meth:`_own`: a fault there
        ends that run only (a temperature of 1e-38 once made every run decoding beside it fail). A fault in the
        shared forward itself still ends the step's runs: their caches are then half written."""
        feeds, budget = [], self.token_budget
        storing = {h for j in batch if j.claimed and j.gen.prefilling for h in j.claim.hashes[len(j.claim.held) :]}
        for run in sorted(batch, key=lambda j: j.gen.prefilling):  # decoding runs first: one token each
            if run.gen.prefilling and run.cancel.cancelled:  # stopped (or out of time) mid-prefill: it ends now
                run.gen.stop()
                run.gen.finish()
                self._retire(run, None)
                continue
            fed = self._own(run, self._feed, run, storing, budget)
            if fed:
                budget -= len(fed[1])
                feeds.append(fed)
        done: list[Run] = []
        self._capture.hold()
        if self.packable and len(feeds) > 1:
            segments = [Segment(ids, start, run.gen.cache, run.gen.feed_recorder) for run, ids, start in feeds]
            with few_rows():
                logits = [x[-1] for x in packed_forward(self.lm, segments, slots=self.slots)]
        else:
            logits = [forward(self.lm, ids, at, run.gen.cache, run.gen.feed_recorder)[-1] for run, ids, at in feeds]
        best = torch.stack(logits).argmax(-1).tolist() if len(logits) > 1 else [None] * len(logits)  # greedy ones'
        self.counters["forwards"] += 1
        self.counters["batched_tokens"] += sum(len(ids) for _, ids, _ in feeds)
        self.counters["max_batch_seen"] = max(self.counters["max_batch_seen"], len(feeds))
        for (run, ids, _), row, top in zip(feeds, logits, best):
            if self._own(run, self._take, run, row, len(ids), top):
                done.append(run)
        for run in done:
            if not run.gen.verify:
                self._retire(run, None)
                continue
            with self._cond:  # out of the batch; still the run a duplicate request shares
                self._running.remove(run)
            run._report(Progress("verify", 0, 1))
            self._unchecked.append((run, time.monotonic()))

    def _own(self, run: Run, work: Callable, *args):
        """``work(*args)`` for one run; a fault ends that run (its callers get the error), not the step."""
        try:
            return work(*args)
        except Exception as exc:
            log.error("a run failed in the engine's step:\n%s", traceback.format_exc())
            self._retire(run, exc)
            return None

    def _feed(self, run: Run, storing: set, budget: int) -> tuple[Run, list[int], int] | None:
        """The run's next feed, after its one look-up in the prefix store (None: it sits this step out)."""
        g = run.gen
        if not run.claimed:
            if self.prefix is not None:
                hashes = self.prefix.hashes(g, next(iter(run.owners)))
                if storing.intersection(hashes):
                    return None  # a run of this step computes blocks this one would reuse: start once they are stored
                run.claim = self.prefix.claim(g, hashes, owners=run.owners)
                if run.keep_turn:
                    keep_turn(self.prefix, g, run.claim)
                storing.update(run.claim.hashes[len(run.claim.held) :])
            run.claimed = True
        if g.prefilling and budget <= 0:
            return None
        ids, start = g.next_feed(budget if g.prefilling else None)
        return run, ids, start

    def _take(self, run: Run, row: torch.Tensor, fed: int, top: int | None = None) -> bool:
        """Hand the run its logits (``top``: their argmax, found for the step's rows together); True once it ends."""
        g = run.gen
        was_prefilling = g.prefilling
        produced = g.take(row, fed, top)
        if was_prefilling and not g.prefilling and self.prefix is not None:
            self.prefix.store(g, run.claim, owners=run.owners)
        if produced:
            run.changed()
        if not g.done:
            return False
        g.finish()
        if run.keep_turn and self.prefix is not None:  # its cache is still whole: the next turn starts from it
            g.trace.turn_cached_tokens = store_turn(self.prefix, g, run.claim, owners=run.owners)
        if self.slots is not None:  # its Trace is complete: the check reads no cache
            self.slots.detach(g.cache)
        return True

    def _check_due(self) -> None:
        """Check the finished runs together (a room's runs end a few steps apart: a short answer ends at its
        end-of-text token; one check for them all stalls the batch once, not once per step) unless the runs
        still decoding beside them will all have ended — by their token budgets, at the latest step's pace —
        before the first of them has waited ``check_wait_s`` × (runs decoding / runs waiting, from 1 to
        :data:`ROOM_WAIT`): checking now would stall every decoding run, waiting delays only the waiting runs'
        verdicts. Outside the capture (the model as loaded). A failed check ends only the runs it was checking."""
        if not self._unchecked or self._closed:
            return
        with self._cond:
            left = max((run.gen.steps_left for run in self._running if run.gen.verify), default=0)
            limit = self.check_wait_s * min(max(1.0, len(self._running) / len(self._unchecked)), ROOM_WAIT)
        waited = time.monotonic() - self._unchecked[0][1]
        if left and left * self._step_s <= limit - waited:
            return
        runs = [run for run, _ in self._unchecked]
        self._unchecked.clear()
        self.counters["checks"] += 1
        self._capture.release()  # the check holds the model as loaded
        t0 = time.monotonic()
        try:
            with torch.inference_mode():
                results = check(self.lm, [j.gen for j in runs], timeout=2.0)
        except Exception as exc:
            log.error("equivalence check failed:\n%s", traceback.format_exc())
            for run in runs:
                self._retire(run, exc)
            return
        finally:
            self.seconds["checks"] += time.monotonic() - t0
        for run, res in zip(runs, results):
            run.gen.trace.equivalence = res
            self._retire(run, None)

    def _retire(self, run: Run, error: BaseException | None) -> None:
        with self._cond:
            if run in self._running:
                self._running.remove(run)
            self._active.pop(run.key, None)
            if error is None and run.gen.trace.stop_reason != "stopped":
                self._finished.keep(run)
            last = not (self._running or self._waiting or self._unchecked)
        if self.prefix is not None:
            self.prefix.release(run.claim)
        if self.slots is not None and run.gen.cache is not None:
            self.slots.detach(run.gen.cache)
        run.gen.release()
        if last:  # its callers may look at the model once it has ended: the capture is gone by then
            self._capture.release()
        run.end(error)
